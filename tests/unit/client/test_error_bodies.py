"""Error bodies quoted in messages: JSON keeps its message, an HTML page becomes one short line."""

from __future__ import annotations

from pdexporter._internal.text import body_reason
from pdexporter.client.sse import error_message_from_body

NGINX_404 = (b"<html>\r\n<head><title>404 Not Found</title></head>\r\n<body>\r\n<center><h1>404 Not Found</h1>"
             b"</center>\r\n<hr><center>nginx/1.25.3</center>\r\n</body>\r\n</html>\r\n")
SPA_PAGE = ("<!DOCTYPE html><html><head><title>Dashboard</title><style>body{color:red}</style>"
            "<script>var x = '<b>not text</b>';</script></head><body>" + "<div>word</div>" * 400 + "</body></html>")


def test_html_pages_become_title_and_first_words() -> None:
    assert error_message_from_body(NGINX_404) == "an HTML page (404 Not Found: nginx/1.25.3)"
    long = error_message_from_body(SPA_PAGE)
    assert long.startswith("an HTML page (Dashboard: word word") and long.endswith("…)")
    assert "<" not in long and "color" not in long and "not text" not in long and len(long) <= 300


def test_json_and_plain_bodies_stay_what_they_say() -> None:
    assert error_message_from_body(b'{"error": {"message": "The model `x` does not exist."}}') == \
        "The model `x` does not exist."
    assert error_message_from_body(b'{"detail": "Not Found"}') == "Not Found"
    assert error_message_from_body(b"upstream\nconnect error") == "upstream connect error"
    assert error_message_from_body(b"") == "(empty body)"
    assert "\n" not in body_reason("x" * 50 + "\n" + "y" * 500) and len(body_reason("z" * 1000)) == 200
