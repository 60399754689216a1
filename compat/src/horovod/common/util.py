"""horovod.common.util: the helper of Horovod's that its test files and some user scripts import."""


def is_version_greater_equal_than(ver, target):
    """Horovod's: version string `ver` >= `target` (ValueError for a non-string). Needs the
    `packaging` package, as Horovod's does (pip and pytest bring it)."""
    from packaging import version

    if not all(isinstance(v, str) for v in (ver, target)):
        raise ValueError("This function only accepts string arguments.")
    return version.parse(ver) >= version.parse(target)
