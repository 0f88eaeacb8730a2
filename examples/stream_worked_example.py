"""The seed's worked example: thirty steps, three intervals, scored and printed.

    PYTHONPATH=src python examples/stream_worked_example.py

Regime a pays a steady 0.8; a shift to b finds the policy briefly lost (0.1), then over-corrected
(0.9, 0.9), then settled at 0.6; a return to a's conditions, scheduled as the alias a_again, pays
only 0.5. Expected output (the seed's printed table)::

    a        J = 0.8000   adapt = --   recover = --   forget = +0.3000   variance = 0.0000
    b        J = 0.6100   adapt = 3   recover = 2   forget = --   variance = 0.0477
    a_again  J = 0.5000   adapt = 1   recover = 1   forget = +0.3000   variance = 0.0000
"""

from continual_eval.stream import EpisodeStep, EpisodeTrace, compute_all_metrics, format_table


def fmt(v, spec):
    return "--" if v is None else format(v, spec)


def main() -> None:
    rewards = [0.8] * 10 + [0.1, 0.9, 0.9] + [0.6] * 7 + [0.5] * 10
    labels = ["a"] * 10 + ["b"] * 10 + ["a_again"] * 10
    trace = EpisodeTrace(
        steps=[
            EpisodeStep(
                step=i,
                reward=rewards[i],
                regime_id=labels[i],
                regime_origin="a" if labels[i] == "a_again" else None,
            )
            for i in range(30)
        ]
    )
    table = compute_all_metrics([trace])
    for k in ("a", "b", "a_again"):
        row = table["per_regime"][k]
        print(
            f"{k:<8} J = {fmt(row['per_configuration_reward'], '.4f')}"
            f"   adapt = {fmt(row['adaptation_speed'], '.0f')}"
            f"   recover = {fmt(row['recovery_time'], '.0f')}"
            f"   forget = {fmt(row['forgetting'], '+.4f')}"
            f"   variance = {fmt(row['stability_variance'], '.4f')}"
        )
    print()
    print(format_table(table))


if __name__ == "__main__":
    main()
