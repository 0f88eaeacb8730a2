"""The pictures' rules: every heatmap (accuracy matrix, confusion matrix normalised and as counts)
writes each number in the colour with the larger WCAG 2 contrast ratio against its own cell
(computed here from the formula), a lower-is-better score gets the reversed colormap (its best
cells bright) and the direction in its colorbar label, and the trajectories give every task its
own open marker, larger for earlier tasks, so coinciding points stay visible."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from continual_eval.plotting import (
    plot_accuracy_matrix,
    plot_confusion_matrix,
    plot_task_trajectories,
    text_colours,
)


def _linear(c: float) -> float:
    return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4


def contrast_choice(rgb: tuple[float, float, float]) -> str:
    """WCAG 2: the text colour whose contrast ratio with ``rgb`` is larger (a plain loop)."""
    r, g, b = (_linear(c) for c in rgb)
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    with_black = (luminance + 0.05) / 0.05
    with_white = 1.05 / (luminance + 0.05)
    return "black" if with_black > with_white else "white"


def test_text_colour_rule_is_the_larger_contrast() -> None:
    rng = np.random.default_rng(0)
    colours = np.concatenate([rng.random((2000, 3)), np.ones((2000, 1))], axis=1)
    chosen = text_colours(colours)
    assert chosen.tolist() == [contrast_choice(tuple(c[:3])) for c in colours]
    assert text_colours([1.0, 1.0, 0.0, 1.0]) == "black"  # yellow
    assert text_colours([0.0, 0.0, 0.3, 1.0]) == "white"  # dark blue


def _cell_texts(ax) -> list[tuple[int, int, str, str]]:
    return [
        (round(t.get_position()[1]), round(t.get_position()[0]), t.get_text(), t.get_color())
        for t in ax.texts
    ]


def _check_every_text(ax, values: np.ndarray) -> int:
    """Each annotation's colour is the larger-contrast choice for its cell's colour."""
    (image,) = ax.get_images()
    checked = 0
    for i, j, _text, colour in _cell_texts(ax):
        rgb = image.cmap(image.norm(values[i, j]))[:3]
        assert colour == contrast_choice(rgb), (i, j, values[i, j], rgb, colour)
        checked += 1
    return checked


def test_accuracy_matrix_text_and_direction() -> None:
    import matplotlib.pyplot as plt

    R = torch.tensor([[0.05, 0.5, 0.9], [0.2, 0.95, 0.6], [0.3, 0.7, 1.0]], dtype=torch.float64)
    b = torch.tensor([0.1, 0.4, 0.8], dtype=torch.float64)
    fig, ax = plot_accuracy_matrix(R, b)
    assert _check_every_text(ax, torch.cat([b[None], R]).numpy()) == 12
    (image,) = ax.get_images()
    assert image.cmap.name == "viridis"
    assert fig.axes[-1].get_ylabel() == "accuracy (higher is better)"
    plt.close(fig)

    loss = torch.tensor([[0.3, 2.0, 2.2], [0.9, 0.25, 1.9], [1.1, 0.6, 0.2]], dtype=torch.float64)
    fig, ax = plot_accuracy_matrix(
        loss, value_range=None, value_label="cross_entropy", higher_is_better=False
    )
    (image,) = ax.get_images()
    assert image.cmap.name == "viridis_r"
    assert fig.axes[-1].get_ylabel() == "cross_entropy (lower is better)"
    bright = [
        float(np.dot(image.cmap(image.norm(v))[:3], [0.2126, 0.7152, 0.0722])) for v in (0.2, 2.2)
    ]
    assert bright[0] > bright[1]  # the best (lowest) loss is the bright end
    assert _check_every_text(ax, loss.numpy()) == 9
    plt.close(fig)


@pytest.mark.parametrize("normalize", [True, False])
def test_confusion_matrix_text_rule(normalize: bool) -> None:
    """Counts too: the largest count sits on viridis' yellow and is written in black (it was
    white on yellow)."""
    import matplotlib.pyplot as plt

    counts = torch.tensor([[50, 2, 0, 1], [3, 40, 5, 0], [0, 4, 30, 9], [1, 0, 12, 20]])
    fig, ax = plot_confusion_matrix(counts, [[0, 1], [2, 3]], normalize=normalize)
    values = counts.double()
    if normalize:
        values = values / values.sum(1, keepdim=True)
    checked = _check_every_text(ax, values.numpy())
    assert checked == (int((counts > 0).sum()) if normalize else counts.numel())
    if not normalize:
        top = next(t for t in _cell_texts(ax) if t[2] == "50")
        assert top[3] == "black"
    plt.close(fig)


def test_trajectories_show_coinciding_points() -> None:
    import matplotlib.pyplot as plt

    same = [[0.8, math.nan, math.nan], [0.6, 0.6, math.nan], [0.6, 0.6, 0.6]]  # all meet at 0.6
    fig, ax = plot_task_trajectories(same)
    lines = ax.get_lines()
    assert len(lines) == 3
    assert len({line.get_marker() for line in lines}) == 3  # a shape per task
    assert all(line.get_markerfacecolor() == "none" for line in lines)  # open: the inner shows
    sizes = [line.get_markersize() for line in lines]
    assert sizes == sorted(sizes, reverse=True) and len(set(sizes)) == 3
    # every task's point at the last stage is drawn at the same place, none left out
    assert [line.get_ydata()[2] for line in lines] == [0.6, 0.6, 0.6]
    plt.close(fig)
