#!/usr/bin/env bash
# mpirun_two_nodes_test.sh STRATA STRATEGY WORKDIR
# Two "nodes" on this machine under OpenMPI's mpirun: hosts nodeA and nodeB with 2 slots each,
# reached through a stand-in for ssh (plm_rsh_agent: it drops the host name and runs OpenMPI's
# daemon here), with TCP over loopback between all ranks as between real nodes (the shared-memory
# transport would take two "nodes" of one machine for one and fail). Ranks 2 and 3 run on the
# second node as its local ranks 0 and 1: every rank log must say so (the local rank picks a
# rank's device slot and its share of the cores), and ddp over the 4 ranks must match one process
# within 2e-6. rtc_hwloc_vmhole none: the daemon started through the agent otherwise maps its
# hardware topology into shared memory at a fixed address hole, which segfaulted in hwloc on the
# CI machine (hwloc_shmem_topology_write); the ranks never need that shared topology.
set -euo pipefail
strata=$1 strategy=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
"$strata" run "$strategy" --disable ddp --out "$work/one" > "$work/one.log" 2>&1 || { cat "$work/one.log"; exit 1; }
cat > "$work/fake_ssh" <<'AGENT'
#!/usr/bin/env bash
while [[ $1 == -* ]]; do shift; done  # ssh options, if any
shift                                  # the host
exec bash -c "$*"
AGENT
chmod +x "$work/fake_ssh"
root=()
[[ $(id -u) == 0 ]] && root=(--allow-run-as-root)
OMP_NUM_THREADS=1 mpirun "${root[@]}" --oversubscribe --bind-to none --host nodeA:2,nodeB:2 -np 4 \
  --mca plm_rsh_agent "$work/fake_ssh" --mca rtc_hwloc_vmhole none --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo \
  "$strata" run "$strategy" --out "$work/nodes" > "$work/nodes.log" 2>&1 || { cat "$work/nodes.log"; exit 1; }
for rank in 0 1 2 3; do
  expected="rank $rank of 4, local rank $((rank % 2)) of 2 on host .* \(launcher openmpi\)"
  grep -Eq "$expected" "$work/nodes/logs/rank_$rank.log" || { echo "rank $rank's log lacks: $expected"; head -3 "$work/nodes/logs/rank_$rank.log"; exit 1; }
done
"$(dirname "$0")/same_losses.sh" "two nodes x 2 ranks (mpirun, tcp)" 2e-6 12 "$work/one" "$work/nodes"
