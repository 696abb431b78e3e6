"""The gateway's cached label children feed the same Prometheus series as `labels()` would."""

from prometheus_client import generate_latest

from talariad.gateway.metrics import Children, GatewayMetrics


def test_a_models_series_are_its_labelled_children():
    m = GatewayMetrics()
    series = m.model("chat")
    assert m.model("chat") is series  # looked up once
    series.running.inc()
    series.finished("stop").inc()
    series.finished("stop").inc()
    series.cached_tokens("device").inc(7)
    codes = Children(m.responses)
    codes.get("200").inc()
    assert m.running.labels("chat")._value.get() == 1
    assert m.finished.labels("chat", "stop")._value.get() == 2
    text = generate_latest(m.registry).decode()
    assert 'talaria_prefix_cache_hit_tokens_total{model="chat",source="device"} 7.0' in text
    assert 'talaria_http_responses_total{code="200"} 1.0' in text
