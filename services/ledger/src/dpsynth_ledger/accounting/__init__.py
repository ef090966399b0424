"""The ledger's accountant: pure functions, no database (docs/privacy.md).

* :mod:`.events` maps dpsynth events to ``dp_accounting`` events (one function);
* :mod:`.rdp` is RDP at one order, the named RDP→DP conversion, and α*;
* :mod:`.pld` is the tight figure, DP-SGD calibration and the largest admissible target;
* :mod:`.gaussian` is one-shot Gaussian releases: their figure and calibration;
* :mod:`.filter` is the Feldman–Zrnic RDP filter that admits jobs.
"""

from dpsynth_ledger.accounting.events import (
    HOLDOUT,
    REPLACE_INTO_ADD_REMOVE,
    WHOLE_DATASET,
    check_neighbouring,
    partition_events,
    to_dp_accounting,
)
from dpsynth_ledger.accounting.filter import RdpFilter
from dpsynth_ledger.accounting.gaussian import (
    calibrate_gaussian_sigma,
    gaussian_discretization,
    gaussian_epsilon,
)
from dpsynth_ledger.accounting.pld import (
    ACCOUNTANT_NAME,
    DEFAULT_DISCRETIZATION,
    REPLACE_ONE_PLD_NAME,
    calibrate_noise_multiplier,
    dp_sgd_epsilon,
    max_admissible_target,
    min_noise_multiplier_for_room,
    pld_epsilon,
)
from dpsynth_ledger.accounting.rdp import (
    CONVERSION_NAME,
    GROUP_FACTOR,
    GROUP_NAME,
    add_up,
    admission_order,
    by_group,
    charge_step,
    epsilon_to_rdp_budget,
    group_rdp,
    mul_up,
    rdp_at_order,
    rdp_step,
    rdp_to_epsilon,
    sum_up,
)

__all__ = [
    "ACCOUNTANT_NAME",
    "CONVERSION_NAME",
    "DEFAULT_DISCRETIZATION",
    "GROUP_FACTOR",
    "GROUP_NAME",
    "HOLDOUT",
    "REPLACE_INTO_ADD_REMOVE",
    "REPLACE_ONE_PLD_NAME",
    "WHOLE_DATASET",
    "RdpFilter",
    "add_up",
    "admission_order",
    "by_group",
    "calibrate_gaussian_sigma",
    "calibrate_noise_multiplier",
    "charge_step",
    "check_neighbouring",
    "dp_sgd_epsilon",
    "epsilon_to_rdp_budget",
    "gaussian_discretization",
    "gaussian_epsilon",
    "group_rdp",
    "max_admissible_target",
    "min_noise_multiplier_for_room",
    "mul_up",
    "partition_events",
    "pld_epsilon",
    "rdp_at_order",
    "rdp_step",
    "rdp_to_epsilon",
    "sum_up",
    "to_dp_accounting",
]
