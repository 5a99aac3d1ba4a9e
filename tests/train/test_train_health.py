"""The collapse signs (`jaxgrpo.train.health`) on hand-written step records."""

from jaxgrpo.train import health


def records(entropy, accuracy, truncated=0.0):
    return [{"step": i + 1, "entropy": e, "accuracy": a, "frac_truncated": truncated}
            for i, (e, a) in enumerate(zip(entropy, accuracy))]


def signs(rs, floor=0.1, window=3):
    return [s.kind for s in health.collapse_warnings(rs, entropy_floor=floor, window=window, max_new_tokens=32)]


def test_low_entropy_without_a_rise_in_accuracy_is_a_collapse():
    # first window accuracy 0.2; last window entropy 0.05, accuracy 0.1 -> collapsed.
    rs = records([2.0, 1.5, 1.0, 0.05, 0.05, 0.05], [0.2, 0.2, 0.2, 0.1, 0.1, 0.1])
    (sign,) = health.collapse_warnings(rs, entropy_floor=0.1, window=3, max_new_tokens=32)
    assert sign.kind == "entropy" and sign.message.startswith("step 6: ")
    assert "0.050 over the last 3 steps" in sign.message and "0.100, no better than 0.200" in sign.message


def test_low_entropy_with_rising_accuracy_is_a_policy_that_learned():
    assert signs(records([2.0, 1.5, 1.0, 0.05, 0.05, 0.05], [0.2, 0.2, 0.2, 0.9, 0.9, 0.9])) == []


def test_entropy_above_the_floor_or_too_few_steps_or_disabled_is_silent():
    flat = [0.2] * 6
    assert signs(records([0.11] * 6, flat)) == []  # above the floor
    assert signs(records([0.01] * 5, flat[:5])) == []  # fewer than two windows
    assert signs(records([0.01] * 6, flat), floor=0.0) == []  # collapse_entropy=0
    assert signs(records([0.01] * 6, flat), window=0) == []  # collapse_window=0


def test_every_completion_truncated_for_a_window_is_a_collapse():
    assert signs(records([2.0] * 3, [0.2] * 3, truncated=1.0)) == ["truncation"]
    nearly = records([2.0] * 3, [0.2] * 3, truncated=1.0)
    nearly[1]["frac_truncated"] = 0.98
    assert signs(nearly) == []
    assert signs(records([2.0] * 2, [0.2] * 2, truncated=1.0)) == []
