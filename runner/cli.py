"""The Hydra entry point, kept thin: configure the process, compose, hand over to `app.run`."""

import sys
from pathlib import Path

from runner.parallel import configure_threads

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")


def check_group_choices(argv):
    """Refuses `group=option` overrides naming a missing option, in one sentence (exit 2).

    Hydra would print a multi-line error and exit 1; a bad option is a config error.
    """
    conf = Path(CONF_DIR)
    for arg in argv:
        if "=" not in arg or arg.startswith(("-", "+", "~", "hydra")):
            continue
        key, _, value = arg.partition("=")
        group = conf / key
        if "." in key or not group.is_dir():
            continue
        options = sorted(p.stem for p in group.glob("*.yaml"))
        for choice in value.split(","):
            if choice not in options:
                print(f"Config error: {key}={choice} is not an option; choose one of: {', '.join(options)}.",
                      file=sys.stderr)
                sys.exit(2)


def main():
    configure_threads()
    check_group_choices(sys.argv[1:])
    import hydra

    from runner import app

    entered = []

    @hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
    def _main(cfg):
        entered.append(True)
        return app.run(cfg)

    try:
        _main()
    except SystemExit as exc:
        # Hydra exits with 1 when it cannot compose the config (an unknown key, a bad
        # override): that is a config error, status 2. Failures inside a run keep theirs.
        if exc.code == 1 and not entered:
            sys.exit(2)
        raise
