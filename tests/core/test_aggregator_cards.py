"""Aggregators are found from their cards, as the presets are: the --aggregator table,
each preset's accepted aggregators and the privacy wrappers' check read them."""

from __future__ import annotations

import pytest

from mmfl_flwr.core import card as C
from mmfl_flwr.core.aggregator_card import AggregatorCard
from mmfl_flwr.core.aggregators import FedAvgAggregator, MeanAggregator, UnbiasedAggregator
from mmfl_flwr.core.robust import MedianAggregator


def test_the_built_in_table_in_its_documented_order():
    assert list(C.AGGREGATORS) == [
        "fedavg",
        "unbiased",
        "mean",
        "median",
        "trimmed-mean",
        "centered-clip",
        "unbiased-centered-clip",
    ]
    for name, make in C.AGGREGATORS.items():
        assert make().name == name  # each card names its class's own name
    private = {c.name for c in C.aggregator_cards() if c.private}
    assert private == {"fedavg", "unbiased", "mean"}
    assert C.aggregator_card_of(FedAvgAggregator()).name == "fedavg"
    assert C.aggregator_card_of(MedianAggregator()).private is False


class _Half(MeanAggregator):
    name = "half"

    def coefficients(self, updates):
        return [0.5 * c for c in super().coefficients(updates)]


@pytest.fixture
def registered():
    C.register_aggregator(AggregatorCard("half", _Half, "half the mean", private=True))
    yield
    C._USER_AGGREGATORS.pop("half", None)


def test_a_registered_aggregator_is_a_choice_of_every_preset_it_pairs_with(registered):
    assert C.AGGREGATORS["half"] is _Half
    assert "half" in C.card("mfa-rr").accepted_aggregators()
    assert "half" in C.card("lvr").accepted_aggregators()
    assert "half" not in C.card("stalevr").accepted_aggregators()  # fixed aggregator
    with pytest.raises(ValueError, match="exists already"):
        C.register_aggregator(AggregatorCard("median", _Half, "x"))
    with pytest.raises(ValueError, match="exists already"):
        C.register_aggregator(AggregatorCard("half", _Half, "x"))
    C.register_aggregator(AggregatorCard("half", _Half, "again"), replace=True)


def test_the_privacy_check_reads_the_cards(registered):
    from mmfl_flwr.presets import make_strategy
    from mmfl_flwr.privacy import _check_aggregator

    _check_aggregator(make_strategy("mfa-rr", aggregator="half"))  # private: accepted
    _check_aggregator(make_strategy("lvr", aggregator="unbiased"))
    with pytest.raises(ValueError, match="supports the aggregators fedavg, unbiased, mean, half"):
        _check_aggregator(make_strategy("mfa-rr", aggregator="median"))
    assert UnbiasedAggregator().name == "unbiased"
