"""`loadgen`: the load generator's command line (its commands come with the loadgen work)."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="loadgen", description="Load generator for OpenAI-compatible endpoints.",
        epilog="No commands are implemented yet. Until they are, `vllm bench serve "
               "--backend openai --base-url http://127.0.0.1:8000` works against kvstack.")
    parser.parse_args(argv)
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
