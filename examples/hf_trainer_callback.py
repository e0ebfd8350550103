"""Hugging Face `Trainer`: step telemetry for tuimon from a `TrainerCallback`.

    from examples.hf_trainer_callback import TuimonTrainerCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[TuimonTrainerCallback("llama-70b")])
    trainer.train()

Each optimizer step (gradient accumulation included) is a step; the time between steps
is the input pipeline's (`data`), or `checkpoint` where the Trainer saved one in it
(agent.reporter_hooks). Samples per step are the global batch on this rank:
per-device batch size x gradient accumulation steps. Rank and world size come from the
Trainer's arguments.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from agent.reporter import StepReporter
from agent.reporter_hooks import HookTimer


class TuimonTrainerCallback(TrainerCallback):
    def __init__(self, job: str, socket_path: str | None = None) -> None:
        self.job = job
        self.socket_path = socket_path
        self.timer: HookTimer | None = None
        self.samples = 0

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        reporter = StepReporter(self.job, args.process_index, args.world_size,
                                socket_path=self.socket_path, local_rank=args.local_process_index)
        self.timer = HookTimer(reporter)
        self.samples = args.per_device_train_batch_size * args.gradient_accumulation_steps

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        if self.timer is not None:
            self.timer.begin()

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.timer is not None:
            self.timer.end(samples=self.samples)

    def on_save(self, args: TrainingArguments, state: TrainerState,
                control: TrainerControl, **kwargs: Any) -> None:
        if self.timer is not None:
            self.timer.saved()

    def on_evaluate(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        if self.timer is not None:
            self.timer.pause()  # evaluation is no training step's waiting

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if self.timer is not None:
            self.timer.finish()
            self.timer.reporter.close()
