"""horovod.common: its submodules exceptions and process_sets are hvdlite's (horovod._alias); util is Horovod's public helpers (env, _cache, the build and version checks)."""
