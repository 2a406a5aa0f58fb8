#include "flat_unit.h"

#include <stdexcept>
#include <unordered_map>

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

namespace strata::sharding {

namespace {

// Full parameters come and go while the parameter tensors (and the autograd graph that saved
// them) stay: the storage they share is emptied and refilled in place.
void free_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, storage->device()));
  storage->set_nbytes(0);
}

void allocate_storage(const at::Tensor& t) {
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
}

}  // namespace

FlatUnit::FlatUnit(std::string name, std::vector<std::pair<std::string, at::Tensor>> params, Communicator& comm,
                   GradReduce reduce, bool persistent_params, UnitDtypes dtypes)
    : name_(std::move(name)), params_(std::move(params)), comm_(comm), reduce_(reduce), persistent_(persistent_params) {
  if (params_.empty()) throw std::logic_error("flat unit '" + name_ + "' has no parameters");
  const at::TensorOptions options = params_.front().second.options().requires_grad(false);
  master_dtype_ = params_.front().second.scalar_type();
  gather_dtype_ = dtypes.gather.value_or(master_dtype_);
  reduce_dtype_ = dtypes.reduce.value_or(gather_dtype_);
  // Persistent parameters are what the optimizer updates, and AllReduce hands each parameter a
  // view of the averaged gradient: both need the parameters in their own dtype.
  if (gather_dtype_ != master_dtype_ && (persistent_ || reduce_ == GradReduce::AllReduce))
    throw std::logic_error("flat unit '" + name_ + "': only units that gather before use and reduce-scatter change dtype");
  for (const auto& [pname, p] : params_)
    if (p.scalar_type() != master_dtype_ || p.device() != options.device())
      throw std::invalid_argument("flat unit '" + name_ + "': parameter '" + pname + "' has another dtype or device than '" +
                                  params_.front().first + "'");
  lay_out();

  at::NoGradGuard no_grad;
  at::Tensor master = at::zeros({padded_}, options);
  for (size_t i = 0; i < params_.size(); ++i)
    master.narrow(0, offsets_[i], params_[i].second.numel()).copy_(params_[i].second.reshape(-1));
  if (!persistent_) shard_ = master.narrow(0, chunk_begin_, chunk_).clone();
  full_ = master.to(gather_dtype_);
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].second;
    p.set_data(full_.narrow(0, offsets_[i], p.numel()).view(p.sizes()));
  }
  if (reduce_ == GradReduce::AllReduce)
    full_grad_ = at::zeros({padded_}, options);
  else
    grad_chunk_ = at::zeros({chunk_}, options);

  make_pieces();
  ready_.assign(params_.size(), true);
  if (!persistent_) release();
  release_gradients();
}

FlatUnit::FlatUnit(std::string name, std::vector<std::pair<std::string, at::Tensor>> params, Communicator& comm, at::Tensor kept_chunk,
                   UnitDtypes dtypes)
    : name_(std::move(name)), params_(std::move(params)), comm_(comm), reduce_(GradReduce::ReduceScatter), persistent_(false) {
  if (params_.empty()) throw std::logic_error("flat unit '" + name_ + "' has no parameters");
  const at::TensorOptions options = kept_chunk.options().requires_grad(false);
  master_dtype_ = kept_chunk.scalar_type();
  gather_dtype_ = dtypes.gather.value_or(master_dtype_);
  reduce_dtype_ = dtypes.reduce.value_or(gather_dtype_);
  lay_out();
  if (kept_chunk.dim() != 1 || kept_chunk.numel() != chunk_)
    throw std::logic_error("flat unit '" + name_ + "': the kept chunk has " + std::to_string(kept_chunk.numel()) + " elements, the unit's chunk " +
                           std::to_string(chunk_));
  at::NoGradGuard no_grad;
  shard_ = kept_chunk;
  // The full buffer's pages are not touched here; release() gives its storage back.
  full_ = at::empty({padded_}, options.dtype(gather_dtype_));
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].second;
    p.set_data(full_.narrow(0, offsets_[i], p.numel()).view(p.sizes()));
  }
  grad_chunk_ = at::zeros({chunk_}, options);
  make_pieces();
  ready_.assign(params_.size(), true);
  release();
  release_gradients();
}

void FlatUnit::lay_out() {
  for (const auto& named : params_) {
    offsets_.push_back(numel_);
    numel_ += named.second.numel();
  }
  const int64_t ranks = comm_.size();
  padded_ = (numel_ + ranks - 1) / ranks * ranks;
  chunk_ = padded_ / ranks;
  chunk_begin_ = chunk_ * comm_.rank();
}

void FlatUnit::make_pieces() {
  const at::Tensor data = data_chunk(), grad = grad_chunk();
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& [pname, p] = params_[i];
    Piece piece{pname, {}, {}, Placement{}};
    piece.placement.shape = p.sizes().vec();
    piece.placement.sharded_over = {Dim::Data};
    const int64_t begin = std::max(offsets_[i], chunk_begin_), end = std::min(offsets_[i] + p.numel(), chunk_begin_ + chunk_);
    if (begin < end) {
      piece.data = data.narrow(0, begin - chunk_begin_, end - begin);
      piece.grad = grad.narrow(0, begin - chunk_begin_, end - begin);
      piece.placement.offset = begin - offsets_[i];
    }
    pieces_.push_back(std::move(piece));
  }
}

void FlatUnit::nest_pieces_in(const Placements& parameter_placements) {
  for (Piece& piece : pieces_)
    if (auto outer = parameter_placements.find(piece.name); outer != parameter_placements.end()) {
      const int64_t shard_size = piece.placement.data_shard_size;
      piece.placement = nest(outer->second, piece.placement.offset, piece.placement.sharded_over);
      piece.placement.data_shard_size = shard_size;
    }
}

void FlatUnit::replicate_across(Communicator& replicas, int64_t group_data_ranks) {
  if (replicas.size() <= 1) return;
  replicas_ = &replicas;
  for (Piece& piece : pieces_) piece.placement.data_shard_size = group_data_ranks;
}

int64_t FlatUnit::replica_reduce_bytes() const {
  if (!replicas_) return 0;
  return (reduce_ == GradReduce::AllReduce ? padded_ : chunk_) * static_cast<int64_t>(c10::elementSize(reduce_dtype_));
}

int64_t FlatUnit::gather_bytes() const { return padded_ * static_cast<int64_t>(c10::elementSize(gather_dtype_)); }

int64_t FlatUnit::reduce_bytes() const { return padded_ * static_cast<int64_t>(c10::elementSize(reduce_dtype_)); }

namespace {
double ring_sent(int64_t bytes, int ranks) { return static_cast<double>(bytes) * (ranks - 1) / ranks; }
}  // namespace

Traffic FlatUnit::gather_traffic() const { return {gather_bytes(), ring_sent(gather_bytes(), comm_.size())}; }

Traffic FlatUnit::reduce_traffic(bool final) const {
  Traffic t{reduce_bytes(), (reduce_ == GradReduce::AllReduce ? 2 : 1) * ring_sent(reduce_bytes(), comm_.size())};
  if (final && replicas_) t.sent += 2 * ring_sent(replica_reduce_bytes(), replicas_->size());  // an all-reduce
  return t;
}

at::Tensor FlatUnit::data_chunk() const { return persistent_ ? full_.narrow(0, chunk_begin_, chunk_) : shard_; }

at::Tensor FlatUnit::grad_chunk() const {
  return reduce_ == GradReduce::AllReduce ? full_grad_.narrow(0, chunk_begin_, chunk_) : grad_chunk_;
}

void FlatUnit::start_gather() {
  if (persistent_ || state_ != State::Released) return;
  allocate_storage(full_);
  gather_input_ = shard_.to(gather_dtype_);
  gather_work_ = comm_.all_gather(full_, gather_input_);
  state_ = State::Gathering;
}

void FlatUnit::wait_gathered() {
  if (state_ == State::Released) start_gather();
  if (state_ == State::Gathering) {
    gather_work_->wait();
    gather_work_.reset();
    gather_input_ = at::Tensor();
    state_ = State::Gathered;
    add_full_offsets();
  }
}

void FlatUnit::add_full_offsets() {
  at::NoGradGuard no_grad;
  // Through the flat buffer, not the parameters: their version counters are autograd's, and a
  // backward's re-gather refills tensors its graph saved.
  for (size_t i = 0; i < full_offsets_.size(); ++i)
    if (full_offsets_[i].defined()) full_.narrow(0, offsets_[i], full_offsets_[i].numel()).add_(full_offsets_[i]);
}

void FlatUnit::set_full_offsets(const NamedTensors& offsets) {
  at::NoGradGuard no_grad;
  if (persistent_ && unoffset_.defined()) full_.copy_(unoffset_), unoffset_ = at::Tensor();
  full_offsets_.clear();
  if (!offsets.empty()) {
    std::unordered_map<std::string, size_t> index;
    for (size_t i = 0; i < params_.size(); ++i) index.emplace(params_[i].first, i);
    full_offsets_.resize(params_.size());
    for (const auto& [name, offset] : offsets) {
      const auto found = index.find(name);
      if (found == index.end()) continue;  // another unit's
      const size_t i = found->second;
      if (!offset.sizes().equals(params_[i].second.sizes()))
        throw std::logic_error("flat unit '" + name_ + "': the offset of '" + name + "' is not of its shape");
      full_offsets_[i] = offset.reshape(-1).to(full_.options());
    }
  }
  if (persistent_) {
    if (!full_offsets_.empty()) unoffset_ = full_.clone(), add_full_offsets();
  } else {
    release();  // the next gather adds them, or gives the chunks' values back
  }
}

void FlatUnit::release() {
  if (persistent_ || state_ == State::Released) return;
  if (state_ == State::Gathering) wait_gathered();
  free_storage(full_);
  state_ = State::Released;
}

void FlatUnit::begin_backward() {
  ready_.assign(params_.size(), false);
  pending_ = params_.size();
}

bool FlatUnit::mark_ready(size_t param_index) {
  if (ready_[param_index]) return false;
  ready_[param_index] = true;
  return --pending_ == 0;
}

std::vector<std::string> FlatUnit::missing_gradients() const {
  std::vector<std::string> names;
  for (size_t i = 0; i < params_.size(); ++i)
    if (!ready_[i]) names.push_back(params_[i].first);
  return names;
}

void FlatUnit::fill_missing_gradients() {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    at::Tensor& p = params_[i].second;
    if (!p.grad().defined()) p.mutable_grad() = at::zeros(p.sizes(), p.options().requires_grad(false));
    mark_ready(i);
  }
}

void FlatUnit::release_gradients() {
  if (gradients_released_) return;
  if (reduce_work_) wait_reduced();
  if (chunk_holds_shares_) throw std::logic_error("FlatUnit " + name_ + ": gradients released while a step's shares accumulate");
  // A parameter's .grad() that is a view of the buffer would point at nothing.
  if (reduce_ == GradReduce::AllReduce)
    for (auto& [pname, p] : params_)
      if (p.grad().defined() && p.grad().is_alias_of(full_grad_)) p.mutable_grad() = at::Tensor();
  free_storage(gradient_buffer());
  gradients_released_ = true;
}

void FlatUnit::allocate_gradients() {
  if (!gradients_released_) return;
  at::Tensor& buffer = gradient_buffer();
  allocate_storage(buffer);
  // The padding is reduced with the rest but belongs to no parameter: zeros, not whatever the
  // allocator hands out.
  if (reduce_ == GradReduce::AllReduce && padded_ > numel_) {
    at::NoGradGuard no_grad;
    buffer.narrow(0, numel_, padded_ - numel_).zero_();
  }
  gradients_released_ = false;
}

void FlatUnit::adopt_gradient(size_t param_index) {
  if (reduce_ != GradReduce::AllReduce) return;
  at::Tensor& p = params_[param_index].second;
  if (!p.grad().defined() || (!gradients_released_ && p.grad().is_alias_of(full_grad_))) return;
  allocate_gradients();
  at::NoGradGuard no_grad;
  at::Tensor view = full_grad_.narrow(0, offsets_[param_index], p.numel()).view(p.sizes());
  view.copy_(p.grad());
  p.mutable_grad() = view;
}

void FlatUnit::start_reduce(bool final) {
  if (!final && reduce_ != GradReduce::ReduceScatter) throw std::logic_error("FlatUnit " + name_ + ": only a reduce-scatter sums shares");
  if (reduce_work_) wait_reduced();  // its buffers are reused, and its share must be in the chunk
  allocate_gradients();
  at::NoGradGuard no_grad;
  final_ = final;
  const at::TensorOptions options = at::TensorOptions().dtype(reduce_dtype_).device(full_.device());
  const bool in_place = reduce_ == GradReduce::AllReduce && reduce_dtype_ == master_dtype_;
  staging_ = in_place ? full_grad_ : at::zeros({padded_}, options);
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i].second;
    // An adopted gradient is in place already (in_place) or copied from the buffer.
    if (p.grad().defined() && !(in_place && p.grad().is_alias_of(full_grad_)))
      staging_.narrow(0, offsets_[i], p.numel()).copy_(p.grad().reshape(-1));
    if (reduce_ == GradReduce::ReduceScatter) p.mutable_grad() = at::Tensor();
  }
  if (reduce_ == GradReduce::AllReduce) {
    reduce_work_ = comm_.all_reduce(staging_, ReduceOp::Avg);
    return;
  }
  // The first share of a step lands in the chunk itself; later ones beside it, to be added.
  reduced_ = reduce_dtype_ == master_dtype_ && !chunk_holds_shares_ ? grad_chunk_ : at::empty({chunk_}, options);
  reduce_work_ = comm_.reduce_scatter(reduced_, staging_, ReduceOp::Avg);
}

void FlatUnit::start_replica_reduce() {
  if (!replicas_ || !reduce_work_ || replica_reduce_started_ || !final_) return;
  reduce_work_->wait();
  if (chunk_holds_shares_) {
    // The replicas average the step's summed shares, in the master dtype.
    at::NoGradGuard no_grad;
    grad_chunk_.add_(reduced_);
    reduced_ = grad_chunk_;
    chunk_holds_shares_ = false;
  }
  reduce_work_ = replicas_->all_reduce(reduce_ == GradReduce::AllReduce ? staging_ : reduced_, ReduceOp::Avg);
  replica_reduce_started_ = true;
}

void FlatUnit::wait_reduced() {
  start_replica_reduce();
  replica_reduce_started_ = false;
  if (!reduce_work_) return;
  reduce_work_->wait();
  reduce_work_.reset();
  at::NoGradGuard no_grad;
  if (reduce_ == GradReduce::ReduceScatter) {
    if (chunk_holds_shares_)
      grad_chunk_.add_(reduced_);
    else if (!reduced_.is_same(grad_chunk_))
      grad_chunk_.copy_(reduced_);
    chunk_holds_shares_ = !final_;
  } else {
    if (!staging_.is_same(full_grad_)) full_grad_.copy_(staging_);
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i].second;
      p.mutable_grad() = full_grad_.narrow(0, offsets_[i], p.numel()).view(p.sizes());
    }
  }
  staging_ = reduced_ = at::Tensor();
}

WorkPtr FlatUnit::start_refresh() {
  if (!persistent_) return nullptr;
  // The all-gather's input must not alias its output.
  return comm_.all_gather(full_, data_chunk().clone());
}

}  // namespace strata::sharding
