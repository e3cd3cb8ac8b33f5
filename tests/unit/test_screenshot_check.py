"""The browser tests' blank-page check: it must fail a blank screenshot, or a browser test
that rendered nothing would pass."""

from __future__ import annotations

import io

import pytest
from PIL import Image, ImageDraw

from tests.support.browser import assert_not_blank, png_colours


def _png(image: Image.Image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def test_a_blank_page_is_caught() -> None:
    blank = _png(Image.new("RGB", (320, 200), "white"))
    assert png_colours(blank) == {(255, 255, 255): 80 * 50}
    with pytest.raises(AssertionError, match="blank page"):
        assert_not_blank(blank)


def test_a_page_with_a_little_text_on_it_is_still_blank() -> None:
    page = Image.new("RGBA", (320, 200), "white")
    ImageDraw.Draw(page).rectangle((0, 0, 8, 8), fill="black")
    with pytest.raises(AssertionError, match="blank page"):
        assert_not_blank(_png(page))


def test_a_rendered_page_passes() -> None:
    page = Image.new("RGB", (320, 200), "white")
    draw = ImageDraw.Draw(page)
    for n in range(16):
        draw.rectangle((n * 20, 0, n * 20 + 19, 100), fill=(n * 16, 255 - n * 16, 128))
    colours = png_colours(_png(page))
    assert sum(colours.values()) == 80 * 50
    assert len(colours) >= 16
    assert_not_blank(_png(page))
