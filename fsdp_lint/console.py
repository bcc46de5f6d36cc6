"""The `fsdp-lint` console script: Ctrl-C while the command line's modules are still being imported
(the first few tenths of a second) ends with "interrupted" and exit code 130, as it does later."""
import sys


def main() -> None:
    try:
        from fsdp_lint.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("fsdp-lint: interrupted\n")
        sys.exit(130)
    cli_main()
