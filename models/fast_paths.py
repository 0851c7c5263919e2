"""The optional fast paths of a model class: declared protocols, resolved in one function."""

from typing import Callable, NamedTuple, Protocol

from models import symmetrize
from runner.errors import ConfigError


class LocalRatios(Protocol):
    """psi(s'_k) / psi(s) for the local energy from a per-sample state, without K full evaluations."""

    @staticmethod
    def local_tables(params):
        """The parameter-derived tables the other functions read, built once per batch."""

    @staticmethod
    def local_state(tables, sigma_xN):
        """The per-configuration state the ratios start from."""

    @staticmethod
    def local_ratios(tables, state, sites_KxJ, delta_KxJ):
        """psi(s'_k) / psi(s) [K] for K moves (spins on `sites` change by `delta`)."""


class SamplerCache(Protocol):
    """log |psi| moved through the Metropolis loop by local updates of a per-chain cache."""

    @staticmethod
    def local_tables(params):
        """As in `LocalRatios`."""

    @staticmethod
    def sampler_init(tables, sigma_CxN):
        """(log |psi| [C], cache) of the chains' configurations."""

    @staticmethod
    def sampler_update(tables, cache, sites_CxK, delta_CxK):
        """(log |psi| [C], cache) after the proposed moves."""


class JacobianProducts(Protocol):
    """Products of the log-derivative matrix with vectors, written out for the model."""

    @staticmethod
    def jacobian_products(params, sigma_CxTxN):
        """(jvp: parameter pytree -> [C, T], transpose: [C, T] -> per-chain parameter sums)."""


PROTOCOLS = (LocalRatios, SamplerCache, JacobianProducts)


class FastPaths(NamedTuple):
    """What the VMC core uses from a model's declared fast paths (None where not declared).

    ratio: (params, sigma_N, sites_KxJ, delta_KxJ) -> psi(s'_k) / psi(s) [K];
    amplitude: (prepare, init, update) for `runner.core.sampler.Amplitude`;
    jacobian_products: the model's `jacobian_products`.
    """

    ratio: Callable | None
    amplitude: tuple | None
    jacobian_products: Callable | None


def members(protocol) -> list[str]:
    """The method names a protocol requires."""
    return [name for name in vars(protocol) if not name.startswith("_")]


def declared(cls) -> tuple:
    """The protocols `cls` opts into in its own body (`fast_paths = (...)`); never inherited."""
    return tuple(vars(cls).get("fast_paths", ()))


def check(cls) -> tuple:
    """The declared protocols of `cls`, each checked to be implemented in full.

    Raises:
        ConfigError: for an unknown entry or a protocol with a missing method.
    """
    protocols = declared(cls)
    for protocol in protocols:
        if protocol not in PROTOCOLS:
            names = ", ".join(p.__name__ for p in PROTOCOLS)
            raise ConfigError("model", f"{cls.__name__}.fast_paths lists {protocol!r}, which is not one of {names}")
        missing = [name for name in members(protocol) if not callable(getattr(cls, name, None))]
        if missing:
            raise ConfigError(
                "model", f"{cls.__name__} declares the {protocol.__name__} fast path but does not define "
                f"{', '.join(missing)}; define them or remove {protocol.__name__} from its fast_paths")
    return protocols


def resolve(model) -> FastPaths | None:
    """The fast paths the model's class declares for itself (checked), or None for none.

    A subclass gets none unless it declares them again: what is right for a class's
    parameters need not be right for a subclass that changes them.
    """
    cls = type(model)
    protocols = check(cls)
    # An instance whose settings the written-out paths do not all cover (e.g. a symmetry projection
    # on top of the model) names those that apply in its class's own `fast_paths_apply`; the
    # others take the generic path.
    applies = vars(cls).get("fast_paths_apply")
    if applies is not None:
        protocols = tuple(p for p in protocols if p in applies(model))
    if not protocols:
        return None
    # Methods of the instance: a model may need its own static settings (a lattice's symmetry
    # permutations) to build its tables; static methods read the same either way.
    ratio = amplitude = products = None
    if LocalRatios in protocols:
        def ratio(params, sigma_N, sites_KxJ, delta_KxJ):
            tables = model.local_tables(params)
            return model.local_ratios(tables, model.local_state(tables, sigma_N), sites_KxJ, delta_KxJ)

        projection = getattr(model, "sector", None)
        if isinstance(projection, symmetrize.Projection) and symmetrize.projects(projection):
            # The declared ratios are the model's before its projection (method `unprojected`).
            ratio = symmetrize.projected_ratio(
                ratio, lambda params, sigma: model.apply({"params": params}, sigma, method="unprojected"),
                projection)
    if SamplerCache in protocols:
        amplitude = (
            model.local_tables,
            model.sampler_init,
            lambda tables, cache, proposed_xN, sites_xK, delta_xK:
                model.sampler_update(tables, cache, sites_xK, delta_xK),
        )
    if JacobianProducts in protocols:
        products = model.jacobian_products
    return FastPaths(ratio, amplitude, products)


def log_abs_method(model) -> str:
    """"log_abs" when the class that defines the model's `__call__` also defines `log_abs`
    (then it is Re log psi of that same call), else "__call__": a subclass that overrides
    `__call__` does not read an inherited `log_abs` of another wavefunction."""
    owner = next(c for c in type(model).__mro__ if "__call__" in vars(c))
    return "log_abs" if "log_abs" in vars(owner) else "__call__"
