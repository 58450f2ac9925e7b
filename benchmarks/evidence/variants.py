"""Gap-Aware with another value of its one constant, gamma (the momentum of
its running average of g*g), as compensations registered through the
package's registry (``hvd_dcasgd.register_compensation``), so that the
simulator and a real server run them by name.  ``gap_aware(gamma)`` names the
variant and registers it on first use; the package's own ``gap_aware`` is
gamma 0.999."""

from __future__ import annotations

from hvd_dcasgd.algorithm.compensation import COMPENSATIONS, GapAwareCompensation, register_compensation

PACKAGE_GAMMA = GapAwareCompensation.gamma


def gap_aware(gamma: float) -> str:
    """The compensation mode of Gap-Aware with ``gamma``, registered if new."""
    if not 0.0 < gamma < 1.0:
        raise ValueError(f"Gap-Aware's gamma must lie strictly between 0 and 1, not {gamma}")
    if gamma == PACKAGE_GAMMA:
        return GapAwareCompensation.name
    name = f"gap_aware_gamma_{gamma:g}"
    if name not in COMPENSATIONS:
        register_compensation(type(f"GapAwareGamma{gamma:g}".replace(".", "_"), (GapAwareCompensation,),
                                   {"name": name, "gamma": gamma, "__doc__": f"Gap-Aware with gamma = {gamma:g}."}))
    return name
