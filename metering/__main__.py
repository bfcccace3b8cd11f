"""``python -m metering``: the `metering` command line."""

from metering.cli import main

if __name__ == "__main__":
    main(prog_name="metering")
