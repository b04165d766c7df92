"""reference.bench.prose.eviction_paragraph words every direction from the rows."""
from __future__ import annotations

from reference.bench.prose import eviction_paragraph


def _rows(window_low=0.2, sinks_low=0.6, h2o_nll=(0.1, 0.01), sinks_nll=(0.5, 0.05),
          reindex_low=0.62, first=(1, 5)):
    rows = []
    for i, budget in enumerate((8, 64)):
        rows += [dict(policy="window", budget=budget, agreement=window_low + 0.3 * i,
                      first_divergence=first[0], delta_nll=2.0, kept_bytes=budget * 1024),
                 dict(policy="sinks + window", budget=budget, agreement=sinks_low + 0.3 * i,
                      first_divergence=first[1], delta_nll=sinks_nll[i], kept_bytes=budget * 1024),
                 dict(policy="sinks + window, cache positions", budget=budget,
                      agreement=reindex_low + 0.3 * i, first_divergence=first[1],
                      delta_nll=sinks_nll[i], kept_bytes=budget * 1024),
                 dict(policy="H2O", budget=budget, agreement=0.7, first_divergence=None,
                      delta_nll=h2o_nll[i], kept_bytes=budget * 1024)]
    return rows


def test_sinks_that_help_are_said_to_raise_the_agreement():
    text = eviction_paragraph(_rows(), 48, 900.0)
    assert "raised the agreement" in text and "left it at step 1" in text
    assert "at 2 of 2 budgets and more at 0" in text
    assert "at most 2% of the steps" in text
    assert "8 KiB of K and V, against 900 KiB" in text


def test_sinks_that_hurt_or_tie_are_said_so():
    assert "lowered the agreement" in eviction_paragraph(_rows(window_low=0.8, sinks_low=0.5), 48, 1.0)
    tied = eviction_paragraph(_rows(window_low=0.5, sinks_low=0.52), 48, 1.0)
    assert "agreed at 52% (left it at step 5), about the same" in tied


def test_h2o_worse_and_ties_are_counted():
    text = eviction_paragraph(_rows(h2o_nll=(0.9, 0.06)), 48, 1.0)
    assert "at 0 of 2 budgets and more at 1" in text
    assert "never left it" not in text
