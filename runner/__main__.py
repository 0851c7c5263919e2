"""Entry point: `python -m runner [overrides]` composes the config and runs one experiment."""

from runner import cli

if __name__ == "__main__":
    cli.main()
