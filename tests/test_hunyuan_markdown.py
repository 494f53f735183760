"""HunyuanOCR 1.5's doc-parse markdown normalisation: each of its ten rewrites, and what each leaves alone."""

from __future__ import annotations

import pytest

from paperlane.models.hunyuan_markdown import normalise_doc_parse as norm


def test_u_layout_coordinates_leave_text_lines_but_not_tables_or_formulas() -> None:
    assert norm("数据来源于高德地图(39,337),(512,900)") == "数据来源于高德地图"
    assert norm("before\n(147,90),(925,415)\nafter") == "before\nafter"  # a bare figure box goes
    assert norm("caption (1,2),(3,4), (5,6),(7,8)") == "caption"
    assert norm("<td>x(1,2),(3,4)</td>") == "<td>x(1,2),(3,4)</td>"
    assert norm("the set $\\{(2,4),(3,3)\\}$") == "the set $\\{(2,4),(3,3)\\}$"  # inside a formula: kept
    assert norm("an icon (1,2),(3,4) inside a line") == "an icon (1,2),(3,4) inside a line"


def test_t_caption_moves_before_its_table() -> None:
    assert norm('<table border="1"><caption> Table 2 </caption><td><tr><td>1</td></tr></table>') == (
        'Table 2\n\n<table border="1"><tr><td>1</td></tr></table>')
    assert norm("<table><caption></caption><tr><td>1</td></tr></table>") == (
        "<table><caption></caption><tr><td>1</td></tr></table>")


def test_e_array_of_paragraphs_becomes_one_display_per_paragraph() -> None:
    assert norm("$$\\begin{array}{l} {a=1} \\\\ \\\\ b=2 \\\\ \\end{array}$$") == "\n\n$$ a=1 $$\n\n$$ b=2 $$\n\n"
    assert norm("\\[\\begin{array}{l} a \\\\ \\\\ b \\end{array}\\]") == "\n\n\\[ a \\]\n\n\\[ b \\]\n\n"
    single = "$$\\begin{array}{l} a \\\\ b \\end{array}$$"  # rows, no paragraph break
    assert norm(single) == single


def test_c_independent_rows_split_and_aligned_ones_stay() -> None:
    assert norm("$$\\begin{gathered} x=1 \\\\[3pt] y=2 \\end{gathered}$$") == "\n\n\\[ x=1 \\]\n\n\\[ y=2 \\]\n\n"
    aligned = "$$\\begin{aligned} x &= a \\\\ &= b \\end{aligned}$$"
    assert norm(aligned) == aligned
    continued = "$$\\begin{split} x = a + b \\\\ + c \\end{split}$$"
    assert norm(continued) == continued


def test_c2_worksheet_cells_split_and_real_alignment_stays() -> None:
    assert norm("$$\\begin{array}{ll} 3+4= & 5+6= \\\\ 7-2= & \\end{array}$$") == (
        "\n\n\\[ 3+4= \\]\n\n\\[ 5+6= \\]\n\n\\[ 7-2= \\]\n\n")
    real = "$$\\begin{array}{rl} x & = a \\\\ y & = b \\end{array}$$"
    assert norm(real) == real


def test_d_left_and_right_are_balanced() -> None:
    assert norm("$$ \\left( a \\begin{array}{c} b \\end{array} $$") == (
        "$$ \\left( a \\begin{array}{c} b \\right. \\end{array} $$")
    assert norm("$$ a \\right) $$") == "$$ \\left. a \\right) $$"
    assert norm("$$ \\left( a \\right) $$") == "$$ \\left( a \\right) $$"


def test_a_a_real_inline_formula_alone_on_its_line_is_displayed() -> None:
    assert norm("text\n$\\sum x_i$\nmore") == "text\n\n\n$$ \\sum x_i $$\n\n\nmore"
    assert norm("$\\sum_i x_i$") == "$\\sum_i x_i$"  # "\\sum_" is no whole command word, and it is short
    assert norm("$x^2$") == "$x^2$"  # short and plain: stays inline
    assert norm("the value $a+b+c+d+e+f+g+h$ here") == "the value $a+b+c+d+e+f+g+h$ here"


def test_w_bare_arithmetic_lines_become_formulas() -> None:
    assert norm("315÷3.5=90     31.2÷6=5.2") == "$$ 315\\div 3.5=90 $$\n$$ 31.2\\div 6=5.2 $$"
    assert norm("1.5×4=6") == "$$ 1.5\\times 4=6 $$"
    assert norm("Total 12 = 3 + 9") == "Total 12 = 3 + 9"  # letters: prose
    assert norm("2024-01-05") == "2024-01-05"  # no '='


def test_f_equation_numbers_are_stripped() -> None:
    assert norm("$$ E = mc^2 \\tag{1.2} $$") == "$$ E = mc^2 $$"
    assert norm("$$ a = b \\qquad (3) $$") == "$$ a = b $$"
    assert norm("$$ a + b = c (2.1) $$") == "$$ a + b = c$$"  # as the official: the number and its space go
    assert norm("$$ (1,2) $$") == "$$ (1,2) $$"


def test_v_display_formulas_lose_a_leading_tab_and_surplus_braces() -> None:
    assert norm("$$ & a = b } $$") == "$$  a = b  $$"
    assert norm("$$ a = \\} $$") == "$$ a = \\} $$"  # an escaped brace is content


def test_plain_markdown_is_untouched() -> None:
    text = "# Invoice\n\nDear customer,\n\n<table><tr><td>Tea</td><td>3</td></tr></table>\n\n- item (a)\n"
    assert norm(text) == text


@pytest.mark.parametrize("text", ["", "$$", "$$ $$", "\\[", "<table><caption>", "$\n$", "(1,2),(3,4)"])
def test_odd_inputs_do_not_raise(text: str) -> None:
    assert isinstance(norm(text), str)
