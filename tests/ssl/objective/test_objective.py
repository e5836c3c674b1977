"""What a resumed run says when it differs from the run its checkpoint was saved in."""

from locatdino.ssl.objective.base import RunLength, resumed_run_change


def test_another_world_size_names_batch_lr_schedules_and_data_order():
    then = RunLength(total_steps=8, steps_per_epoch=4, global_batch=8, world_size=4)
    now = RunLength(total_steps=6, steps_per_epoch=8, global_batch=4, world_size=2)
    assert resumed_run_change(then, now) == (
        "resumed on 2 ranks, the checkpoint was trained on 4: global batch 8 -> 4 images, so the peak lr x 0.5 (it "
        "scales with the global batch); 4 -> 8 steps per epoch, schedules rebuilt for 6 steps (were 8); the shards are "
        "split over the ranks anew, so the data order differs from an uninterrupted run"
    )


def test_same_world_size_other_length():
    then = RunLength(total_steps=8, steps_per_epoch=4, global_batch=8, world_size=4)
    assert resumed_run_change(then, RunLength(16, 4, 8, 4)).startswith("the schedules differ from the checkpoint's: ")
    old = RunLength(8, 4, 8)  # a checkpoint from before the world size was recorded
    assert resumed_run_change(old, RunLength(8, 4, 8, 2)).startswith("the schedules differ")
