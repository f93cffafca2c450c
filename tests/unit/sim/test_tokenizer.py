from pdexporter.sim.tokenizer import WordTokenizer


def test_word_ids_follow_the_dummy_models_convention():
    tok = WordTokenizer(151_936)
    assert tok.encode("t1 t2 t151935") == [1, 2, 151935]
    assert tok.encode("hello world") == tok.encode("  hello\nworld ")  # whitespace split, stable
    assert all(0 <= i < 151_936 for i in tok.encode("hello t999999 world"))
    assert tok.decode([65553, 89305]) == " t65553 t89305"  # as vLLM streams the dummy model


def test_chat_template_joins_contents():
    tok = WordTokenizer(151_936)
    text = tok.apply_chat_template([{"role": "system", "content": "t5 t6"},
                                    {"role": "user", "content": [{"type": "text", "text": "t7"}]}])
    assert tok.encode(text) == [5, 6, 7]
