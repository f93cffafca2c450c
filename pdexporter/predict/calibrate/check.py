"""The fit against its starting profile on the held-out configurations (`held_out_check`), and what
`sim calibrate` writes: a fit worse than its base refused (`refusal`) unless forced, then labelled."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pdexporter.errors import PdexporterError
from pdexporter.predict.calibrate.holdout import GUARDED, METRIC_LABELS, HoldoutReport, worse_than_base
from pdexporter.sim.profile import CalibrationCheck, Profile

if TYPE_CHECKING:
    from pdexporter.predict.calibrate.fit import Calibration

__all__ = [
    "FitWorseThanBase",
    "check_reports",
    "forced_warning",
    "held_out_check",
    "label_worse",
    "profile_to_write",
    "refusal",
    "worse_of",
]


class FitWorseThanBase(PdexporterError):
    """The fitted profile predicts held-out configurations worse than the profile it started from."""

    exit_code = 5


def label_worse(profile: Profile, worse: Sequence[tuple[str, float, float]], n_held: int) -> Profile:
    """The profile labelled as a fit worse than its base (written only under --force)."""
    what = "; ".join(f"{m} MAPE {f:.1f} % vs {b:.1f} % with the base" for m, f, b in worse)
    note = (f"WORSE THAN THE BASE PROFILE on the {n_held} held-out configurations ({what}); written because "
            f"--force was given. " + profile.calibration_note)
    return profile.model_copy(update={"calibration": "calibrated-worse-than-base", "calibration_note": note})


# -- the fit against its starting profile, on the held-out configurations ----------------------------

def held_out_check(cal: Calibration, tolerance: float = 1.0) -> CalibrationCheck:
    """Score the starting profile and the fitted one on the held-out configurations, per quantity of
    the held-out table (`GUARDED`), and name those the fit predicts worse by more than `tolerance`
    points of MAPE, the worst first (`held_out` 0: nothing was held out or predicted, nothing checked)."""
    return check_reports(cal.base.name, len(cal.held_keys), cal.held_base, cal.held_fitted, tolerance)


def check_reports(base_name: str, n_held: int, held_base: HoldoutReport | None, held_fitted: HoldoutReport | None,
                  tolerance: float = 1.0) -> CalibrationCheck:
    """`held_out_check` from the two held-out reports themselves."""
    if held_base is None or held_fitted is None or not n_held:
        return CalibrationCheck(base_profile=base_name, held_out=0, tolerance=tolerance)
    worse = sorted(worse_than_base(held_base, held_fitted, tolerance=tolerance), key=lambda w: w[2] - w[1])
    return CalibrationCheck(
        base_profile=base_name, held_out=n_held, tolerance=tolerance,
        mape_fitted={m: _rounded(held_fitted.metric_mape(m)) for m in GUARDED},
        mape_base={m: _rounded(held_base.metric_mape(m)) for m in GUARDED},
        worse=[m for m, _, _ in worse])


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(float(x), 3)


def worse_of(check: CalibrationCheck) -> list[tuple[str, float, float]]:
    """(quantity, fitted MAPE %, base MAPE %) of each quantity the check found worse, in its order."""
    return [(m, float(check.mape_fitted[m] or 0.0), float(check.mape_base[m] or 0.0)) for m in check.worse]


def refusal(check: CalibrationCheck, *, out: object = None) -> FitWorseThanBase:
    """The one-line error of a fit worse than its base: the worst quantity and both errors."""
    worse = worse_of(check)
    metric, f, b = worse[0]
    digits = 1 if round(f, 1) != round(b, 1) else 3
    more = f" (and {', '.join(METRIC_LABELS[m] for m, _, _ in worse[1:])})" if len(worse) > 1 else ""
    return FitWorseThanBase(
        f"the fit predicts the {check.held_out} held-out configurations worse than the base profile "
        f"{check.base_profile} (by more than --tolerance {check.tolerance:g} points): {METRIC_LABELS[metric]} "
        f"MAPE {f:.{digits}f} % vs {b:.{digits}f} %{more}; "
        + ("profile not written" if out is not None else "nothing to write")
        + " (--force writes it, labelled calibrated-worse-than-base)")


def forced_warning(check: CalibrationCheck) -> str:
    """What `sim calibrate --force` says when it writes a fit worse than its base."""
    what = "; ".join(f"{METRIC_LABELS[m]} MAPE {f:.1f} % vs {b:.1f} %" for m, f, b in worse_of(check))
    return (f"WRITTEN UNDER --force: the fit predicts the {check.held_out} held-out configurations worse than the "
            f"base profile {check.base_profile} ({what}); the profile says so (calibration: "
            "calibrated-worse-than-base, calibration_check.forced)")


def profile_to_write(profile: Profile, check: CalibrationCheck, *, force: bool = False) -> Profile:
    """The fitted profile (`Calibration.profile`) as `sim calibrate` writes it, its `calibration_check`
    recorded. A fit the check found worse than its base is refused (`FitWorseThanBase`, `refusal`) unless
    `force`, and then labelled `calibrated-worse-than-base` with `calibration_check.forced`."""
    if check.worse and not force:
        raise refusal(check, out=True)
    if check.worse:
        profile = label_worse(profile, worse_of(check), check.held_out)
        check = check.model_copy(update={"forced": True})
    return profile.model_copy(update={"calibration_check": check})
