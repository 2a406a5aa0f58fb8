// A shared library named like a plugin that has no entry point.
extern "C" __attribute__((visibility("default"))) int not_a_plugin() { return 42; }
