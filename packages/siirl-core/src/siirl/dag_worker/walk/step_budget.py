"""How many steps a run trains, what caps that number, and how to raise it.

verl's semantics: the run ends after ``trainer.total_epochs`` passes over the data, or at
``trainer.total_training_steps`` when that is set and comes first. A number of steps asked
for beyond the epochs is therefore capped by them; the run says so (at start, and when a
resumed run finds nothing left to train) with the override that lifts the cap, instead of
quietly stopping short.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional

from siirl.errors import ConfigError


@dataclass(frozen=True)
class StepBudget:
    explicit: Optional[int]  # trainer.total_training_steps
    epochs: int  # trainer.total_epochs
    steps_per_epoch: Optional[int]  # None: the workflow reads no dataset

    @classmethod
    def of(cls, config: Any, steps_per_epoch: Optional[int]) -> StepBudget:
        budget = cls(config.trainer.total_training_steps, config.trainer.total_epochs,
                     int(steps_per_epoch) if steps_per_epoch else None)
        if budget.explicit is None and budget.by_epochs is None:
            raise ConfigError("trainer.total_training_steps must be set when the workflow "
                              "reads no dataset")
        return budget

    @property
    def by_epochs(self) -> Optional[int]:
        return self.epochs * self.steps_per_epoch if self.steps_per_epoch else None

    @property
    def steps(self) -> int:
        return min(n for n in (self.explicit, self.by_epochs) if n is not None)

    @property
    def capped_by_epochs(self) -> bool:
        return self.by_epochs is not None and self.by_epochs == self.steps and (
            self.explicit is None or self.explicit > self.by_epochs)

    def _epochs_cap(self) -> str:
        return (f"trainer.total_epochs={self.epochs} x {self.steps_per_epoch} steps per "
                f"epoch = {self.by_epochs} steps")

    def _epochs_for(self, steps: int) -> int:
        return math.ceil(steps / self.steps_per_epoch)

    def capped_notice(self) -> Optional[str]:
        """When total_training_steps asks for more than the epochs hold; else None."""
        if self.explicit is None or not self.capped_by_epochs:
            return None
        return (f"siirl: trainer.total_training_steps={self.explicit} is capped by "
                f"{self._epochs_cap()}: this run ends at step {self.steps}; for "
                f"{self.explicit} steps add trainer.total_epochs="
                f"{self._epochs_for(self.explicit)}")

    def finished_notice(self, at_step: int) -> str:
        """A resumed run with no step left to train: what caps it and how to go on."""
        per_epoch = self.steps_per_epoch
        if self.capped_by_epochs:
            cap = self._epochs_cap()
            wanted = self.explicit if self.explicit is not None and self.explicit > at_step \
                else at_step + per_epoch
        else:
            cap = f"trainer.total_training_steps={self.explicit}"
            wanted = at_step + (per_epoch or 100)
        override = f"trainer.total_training_steps={wanted}"
        if self.by_epochs is not None and self.by_epochs < wanted:
            override += f" trainer.total_epochs={self._epochs_for(wanted)}"
        return (f"siirl: nothing left to train: the checkpoint is at step {at_step} and this "
                f"run ends at step {self.steps} ({cap}); to train on in this directory, add "
                f"{override}")
