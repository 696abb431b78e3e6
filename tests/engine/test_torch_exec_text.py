"""Units of the torch executor: streamed text with stop strings, and the session KV book."""

from __future__ import annotations

from talariad.engine.executors.torch_engine import KVBook, TextStream
from talariad.engine.executors.torch_engine.hosted import tiny_tokenizer
from talariad.instance import KVLocation
from talariad.types import KVState


def stream_all(text: str, stop: list[str]) -> tuple[list[str], bool]:
    tok = tiny_tokenizer(320)
    ids, stream, pieces = tok.encode(text), TextStream(tok, stop), []
    for i, t in enumerate(ids):
        piece, hit = stream.push(t, final=i == len(ids) - 1)
        pieces.append(piece)
        if hit:
            return pieces, True
    return pieces, False


def test_pieces_rebuild_the_text_even_across_multibyte_characters():
    pieces, hit = stream_all("Hello wörld: 3 → 4 ✓ done", [])
    assert "".join(pieces) == "Hello wörld: 3 → 4 ✓ done" and not hit
    assert all("\ufffd" not in p for p in pieces)


def test_a_stop_string_ends_the_text_before_it_and_is_never_emitted():
    pieces, hit = stream_all("def main():\n    return 0\nEND of file", ["\nEND"])
    assert hit and "".join(pieces) == "def main():\n    return 0"


def test_the_stream_names_the_stop_string_that_fired_first():
    tok = tiny_tokenizer(320)
    stream = TextStream(tok, ["zzz", "return", "main"])
    for t in tok.encode("def main():\n    return 0"):
        _, hit = stream.push(t)
        if hit:
            break
    assert hit and stream.fired == "main"


def test_turn_end_tokens_of_the_chat_template_end_an_answer():
    from talariad.engine.executors.torch_engine.hosted import load_hosted

    hosted = load_hosted("m", path=None, profile="tiny", seed=1, device="cpu")
    assert hosted.tokenizer.token_id("<|im_end|>") in hosted.eos_ids()


def test_kv_book_reuses_any_device_prefix_but_whole_host_pages():
    book = KVBook(page_size=4)
    rec = book.open("s", "m", "c1")
    rec.tokens, rec.valid, rec.host_tokens = list(range(11)), 10, 8
    prompt = list(range(7)) + [99, 100]
    assert book.reusable("s", "m", prompt, host_kv=True) == 7  # device: any common prefix
    assert book.off_device("s", "m", host_kv=True) == KVLocation("s", "m", KVState.HOST, 8)
    assert (
        book.reusable("s", "m", prompt, host_kv=True) == 4
    )  # host: whole pages of the common prefix
    assert book.reusable("s", "m", prompt, host_kv=False) == 0
    assert book.off_device("s", "m", host_kv=False) == KVLocation("s", "m", KVState.MISSING, 0)


def test_idle_owners_are_evicted_least_recently_used_first():
    book = KVBook(page_size=4)
    for owner in ("a", "b", "c"):
        rec = book.open(owner, "m", f"call-{owner}")
        rec.tokens, rec.valid = [1, 2, 3], 2
    for owner in ("b", "a"):
        book.get(owner, "m").busy = None
        book.touch(book.get(owner, "m"))
    assert book.idle_on_device("m", keep=set()) == ["b", "a"]  # c is still running
    assert book.idle_on_device("m", keep={"b"}) == ["a", "b"]
