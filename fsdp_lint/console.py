"""The `fsdp-lint` console script: Ctrl-C while the command line's modules are still being imported
(the first few tenths of a second) ends with "interrupted" and exit code 130, as it does later.

A re-run of a command whose inputs are all unchanged prints its stored output before click or the
pipeline is imported (``fastpath``), and so does a command whose files are all skipped by the screen
(its report is one line); anything else goes to the command line (``cli``)."""
import sys


def main() -> None:
    try:
        try:
            from fsdp_lint.fastpath import plain_output, stored_output

            stored = stored_output(sys.argv[1:])
            if stored is None:
                stored = plain_output(sys.argv[1:])
        except KeyboardInterrupt:
            raise
        except Exception:  # noqa: BLE001 - the full command line decides (and reports) instead
            stored = None
        if stored is None:
            from fsdp_lint.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("fsdp-lint: interrupted\n")
        sys.exit(130)
    if stored is not None:
        stdout, stderr, code = stored
        sys.stderr.write(stderr)
        sys.stderr.flush()
        sys.stdout.write(stdout)
        sys.stdout.flush()
        sys.exit(code)
    try:
        cli_main()
    finally:
        engine = sys.modules.get("fsdp_lint.engine")
        if engine is not None:
            engine.SCREENED = None      # the fast path's screens were for this command only
