"""DINO self-distillation: loss, head, teacher EMA, schedules, LightningModule, callbacks."""
