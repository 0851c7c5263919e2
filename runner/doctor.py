"""`python -m runner.doctor [overrides]`: checks the environment for the chosen parallel backend.

Checks, in an order that cannot hang on a broken setup: host name resolution and proxy
variables (both make gRPC, and so `jax.distributed`, hang), then joining the processes,
devices, a real cross-process reduction under a timeout, and 64-bit types. Prints what is
wrong in plain words and exits with status 1 when something is broken.
"""

import ipaddress
import os
import socket
import sys
import threading

from runner.parallel import distributed
from runner.parallel.distributed import PROXY_VARS

REDUCTION_TIMEOUT_S = 60


class Report:
    """Collects check results; `problems` decides the exit status."""

    def __init__(self):
        self.problems = 0

    def ok(self, what):
        print(f"  ok       {what}", flush=True)

    def info(self, what):
        print(f"  info     {what}", flush=True)

    def problem(self, what, fix):
        self.problems += 1
        print(f"  PROBLEM  {what}\n           fix: {fix}", flush=True)


def _resolve(host, timeout=5.0):
    """IP address of `host`, or None if it does not resolve within `timeout` seconds."""
    result = []
    worker = threading.Thread(target=lambda: result.append(_try_resolve(host)), daemon=True)
    worker.start()
    worker.join(timeout)
    return result[0] if result else None


def _try_resolve(host):
    try:
        return socket.gethostbyname(host)
    except OSError:
        return None


def _no_proxy_covers(host, entries) -> bool:
    """Whether gRPC's no_proxy handling would bypass the proxy for `host`."""
    for entry in entries:
        if entry == host or (entry.startswith(".") and host.endswith(entry)) or host.endswith("." + entry):
            return True
        try:
            if ipaddress.ip_address(host) in ipaddress.ip_network(entry, strict=False):
                return True
        except ValueError:
            pass
    return False


def check_proxies(host: str | None, report: Report, env=None) -> bool:
    """Proxy variables that would send the coordinator connection through a proxy.

    Returns:
        True when the setup is safe to connect.
    """
    env = os.environ if env is None else env
    proxies = [v for v in PROXY_VARS if env.get(v)]
    if not proxies:
        report.ok("no proxy variables set (gRPC connects directly)")
        return True
    raw = env.get("no_proxy", "") + "," + env.get("NO_PROXY", "")
    entries = [e.strip() for e in raw.split(",") if e.strip()]
    wildcards = [e for e in entries if "*" in e and e != "*"]
    if "*" in entries:
        report.ok(f"{proxies[0]} is set but no_proxy=* bypasses it")
        return True
    safe = True
    if wildcards:
        safe = False
        report.problem(
            f"{proxies[0]} is set and no_proxy contains {', '.join(wildcards)}: gRPC does not understand "
            "wildcards, so the connection to the JAX coordinator goes to the proxy and hangs",
            "python -m runner adds the coordinator host to no_proxy itself; for other tools unset the proxy "
            "variables (e.g. `env -u http_proxy -u https_proxy ...`) or list hosts or networks explicitly "
            "(e.g. no_proxy=localhost,127.0.0.1,10.0.0.0/8)",
        )
    if host and not _no_proxy_covers(host, entries):
        safe = False
        report.problem(
            f"{proxies[0]} is set and no_proxy does not cover the coordinator host {host!r}: gRPC would "
            "connect to it through the proxy and hang",
            f"python -m runner adds {host} to no_proxy itself; for other tools add it to no_proxy "
            "or unset the proxy variables",
        )
    if safe:
        report.ok(f"{proxies[0]} is set and no_proxy covers the coordinator {host!r}")
    return safe


def check_hostnames(host: str | None, report: Report) -> bool:
    own = socket.gethostname()
    safe = True
    if _resolve(own) is None:
        safe = False
        report.problem(
            f"this machine's host name {own!r} does not resolve: JAX's distributed runtime can wait forever",
            f"add `127.0.0.1 {own}` (or the machine's address) to /etc/hosts, or fix DNS",
        )
    else:
        report.ok(f"host name {own!r} resolves")
    if host:
        address = _resolve(host)
        if address is None:
            safe = False
            report.problem(f"the coordinator host {host!r} does not resolve",
                           "use an address or a name every node can resolve (check /etc/hosts and DNS)")
        else:
            report.ok(f"coordinator host {host!r} resolves to {address}")
    return safe


def _reduction(report: Report) -> None:
    """A real cross-process sum over every device, with a timeout."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from runner.parallel.mesh import make_mesh

    layout = make_mesh("sharded")
    n = layout.n_devices
    values = np.arange(1, n + 1, dtype=np.float32)
    outcome = []

    def reduce():
        x = jax.make_array_from_callback((n,), layout.chains, lambda index: values[index])
        total = jax.jit(jnp.sum, out_shardings=layout.replicated)(x)
        outcome.append(float(np.asarray(total.addressable_data(0))))

    worker = threading.Thread(target=reduce, daemon=True)
    worker.start()
    worker.join(REDUCTION_TIMEOUT_S)
    expected = float(values.sum())
    if not outcome:
        report.problem(f"a sum over the {n} devices did not finish within {REDUCTION_TIMEOUT_S} s",
                       "a peer process is missing or stuck, or the collectives cannot connect")
        _finish(report.problems)
    elif outcome[0] != expected:
        report.problem(f"a sum over {n} devices gave {outcome[0]}, expected {expected}",
                       "the collectives are broken; report this with the output above")
    else:
        report.ok(f"cross-process reduction over {n} devices in {distributed.process_count()} process(es) gives {outcome[0]:g}")


def _finish(problems: int):
    """Prints the verdict and exits (os._exit: a stuck collective thread must not block it)."""
    if problems:
        print(f"doctor: {problems} problem(s) found", flush=True)
        os._exit(1)
    print("doctor: everything looks right", flush=True)
    os._exit(0)


def diagnose(parallel: dict, x64: bool) -> int:
    """Runs every check; returns the number of problems."""
    report = Report()
    print(f"vmc-runner doctor: backend={parallel.get('backend')}", flush=True)
    from runner.parallel.distributed import coordinator_host

    host = coordinator_host(parallel)
    multi = parallel.get("backend") in ("distributed", "multinode")
    safe = check_hostnames(host if multi else None, report)
    safe = check_proxies(host if multi else None, report) and safe
    if multi and not safe:
        report.info("not joining the other processes: with the problems above it would hang")
        return report.problems

    import jax

    from runner.errors import ConfigError
    from runner.parallel import distributed

    try:
        distributed.initialize(parallel, x64)
    except ConfigError as err:
        report.problem(err.sentence(), "fix the parallel settings")
        return report.problems
    except distributed.DistributedInitError as err:
        report.problem(str(err), "start every process with the same settings")
        return report.problems
    report.ok(f"jax {jax.__version__}, platform {jax.default_backend()}")
    report.ok(f"process {distributed.process_index()} of {distributed.process_count()}")
    report.ok(f"{jax.local_device_count()} local device(s): {', '.join(str(d) for d in jax.local_devices())}")
    report.ok(f"{jax.device_count()} device(s) in all")
    _reduction(report)
    import jax.numpy as jnp

    got = jnp.zeros((), jnp.float64 if x64 else jnp.float32).dtype
    if x64 and got != jnp.float64:
        report.problem("64-bit types are off although the dtype needs them", "report this; it is a bug")
    else:
        report.ok(f"x64 {'on' if x64 else 'off'} as the dtype group asks (arrays are {got})")
    return report.problems


USAGE = """usage: python -m runner.doctor [overrides]

Checks the environment for the parallel backend the config chooses: devices, processes, a real
cross-process reduction, host name resolution, proxy variables that break gRPC, and x64.
Takes the same overrides as `python -m runner`, e.g.

  python -m runner.doctor parallel=sharded parallel.cpu_devices=4
  srun python -m runner.doctor parallel=multinode

Exits 0 when everything looks right, 1 when a problem was found, 2 for a bad config value."""


def _usage_error(sentence: str):
    print(f"Config error: {sentence}.", file=sys.stderr)
    sys.exit(2)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help", "help") for arg in argv):
        print(USAGE)
        sys.exit(0)
    flags = [arg for arg in argv if arg.startswith("-")]
    if flags:
        _usage_error(f"{flags[0]} is not an option of runner.doctor, which takes only config overrides "
                     "(key=value); see python -m runner.doctor --help")
    from runner.parallel.runtime import configure_runtime

    configure_runtime()
    from omegaconf import OmegaConf

    from runner.config.build import DTYPES
    from runner.config.compose import compose
    from runner.errors import ConfigError

    try:  # the one composition of the CLI, runner.run and runner.evaluate, overrides checked
        cfg = OmegaConf.to_container(compose(argv), resolve=True)
    except ConfigError as err:
        _usage_error(err.sentence().rstrip(".") + "; see python -m runner.doctor --help")
    x64 = DTYPES.get(cfg["dtype"]["name"], (None, True))[1]
    problems = diagnose(cfg["parallel"], x64)
    _finish(problems)


if __name__ == "__main__":
    main()
