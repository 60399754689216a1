"""horovod.common: its submodules exceptions and process_sets are hvdlite's (horovod._alias); util is Horovod's version helper."""
