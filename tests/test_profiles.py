"""Model profiles: prompts, messages, sampling and the parsers of raw model answers."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from paperlane.errors import EngineOutputError, UsageError
from paperlane.models.engine import EngineOutput, InputSpec
from paperlane.models.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    Profile,
    box_to_quad,
    clean_repetition,
    get_profile,
    markdown_to_text,
    parse_fields,
    parse_spotting,
    strip_fence,
)
from paperlane.schemas import Task, TaskSpec

SPOT = TaskSpec(task=Task.SPOTTING)
W, H = 800, 600


@pytest.fixture(params=sorted(PROFILES))
def profile(request: pytest.FixtureRequest) -> Profile:
    return get_profile(request.param)


def spot(profile: Profile, raw: str, *, finish_reason: str | None = "stop") -> EngineOutput:
    return profile.parse(raw, SPOT, image_width=W, image_height=H, finish_reason=finish_reason)


# --- registry, input, prompts, messages, sampling ----------------------------------------------


def test_get_profile_knows_the_three_families() -> None:
    assert DEFAULT_PROFILE == "hunyuanocr-1.0"
    assert get_profile().name == "hunyuanocr-1.0"
    assert get_profile(" HunyuanOCR-1.5 ").name == "hunyuanocr-1.5"
    assert get_profile("generic").name == "generic"


def test_unknown_profile_is_a_usage_error_listing_the_known_ones() -> None:
    with pytest.raises(UsageError) as caught:
        get_profile("tesseract")
    assert "'tesseract'" in str(caught.value)
    for name in PROFILES:
        assert name in str(caught.value)


def test_input_specs() -> None:
    hunyuan = InputSpec(
        encoding="jpeg", max_side=2048, max_pixels=2048 * 2048, min_pixels=512 * 512, multiple_of=32
    )
    assert get_profile("hunyuanocr-1.0").input_spec() == hunyuan
    assert get_profile("hunyuanocr-1.5").input_spec() == hunyuan
    generic = get_profile("generic").input_spec()
    assert (generic.encoding, generic.max_side, generic.multiple_of) == ("jpeg", 1600, 28)


def test_hunyuan_10_prompts_are_the_official_ones() -> None:
    profile = get_profile("hunyuanocr-1.0")
    assert profile.prompt(SPOT) == (
        "Detect and recognize text in the image, and output the text coordinates in a formatted manner."
    )
    assert profile.prompt(TaskSpec(task=Task.TEXT)) == "Extract the text in the image."
    assert profile.prompt(TaskSpec(task=Task.PARSE)).startswith("Extract all information from the main body")
    assert profile.prompt(TaskSpec(task=Task.FIELDS, fields=("name", "total due"))) == (
        "Extract the content of the fields: ['name','total due'] from the image and return it in JSON format."
    )
    translate = profile.prompt(TaskSpec(task=Task.TRANSLATE, target_language="German"))
    assert translate.startswith("First extract the text, then translate the text content into German. ")
    assert "English" not in translate
    assert profile.prompt(TaskSpec(task=Task.TABLE)) == "Parse the table in the image into HTML."
    assert profile.prompt(TaskSpec(task=Task.FORMULA)) == (
        "Identify the formula in the image and represent it using LaTeX format.")


def test_hunyuan_15_prompts_are_its_locked_official_ones() -> None:
    # Tencent-Hunyuan/HunyuanOCR inference/utils/tasks.py, TASK_PROMPTS (Chinese, one per task type).
    profile = get_profile("hunyuanocr-1.5")
    assert profile.prompt(TaskSpec(task=Task.PARSE)) == (
        "提取文档图片中正文的所有信息用markdown格式表示，其中页眉、页脚部分忽略，表格用html格式表达，文档中公式用"
        "latex格式表示，按照阅读顺序组织进行解析。")
    assert profile.prompt(SPOT) == (
        "检测并识别图中所有的文字行，请按从上到下、从左到右的阅读顺序进行识别。 "
        "输出格式为 JSON 数组，每个元素必须包含："
        '"box": [xmin, ymin, xmax, ymax]（坐标需归一化到 [0, 1000] 范围内）；"text": "识别出的文字内容"。 '
        "注意：请直接输出 JSON 数组，不要包含任何多余的描述性文字。")
    assert profile.prompt(TaskSpec(task=Task.TEXT)) == "提取图中的文字。"
    assert profile.prompt(TaskSpec(task=Task.TABLE)) == "把图中的表格解析为HTML。"
    assert profile.prompt(TaskSpec(task=Task.FORMULA)) == "识别图片中的公式，用LaTeX格式表示。"
    assert profile.prompt(TaskSpec(task=Task.CHART)) == (
        "解析图中的图表，对于流程图使用Mermaid格式表示，其他图表使用Markdown格式表示。")
    assert profile.prompt(TaskSpec(task=Task.TRANSLATE, target_language="English")).endswith("再将文字内容翻译为英文。")
    assert profile.prompt(TaskSpec(task=Task.TRANSLATE, target_language=" zh ")).endswith("再将文字内容翻译为中文。")
    # No official 1.5 prompt: another language gets 1.0's template, fields 1.0's Chinese prompt.
    assert "into German." in profile.prompt(TaskSpec(task=Task.TRANSLATE, target_language="German"))
    assert profile.prompt(TaskSpec(task=Task.FIELDS, fields=("总金额",))) == (
        "提取图片中的: ['总金额'] 的字段内容，并按照 JSON 格式返回。")


def test_generic_prompts_carry_the_keys_and_the_language() -> None:
    generic = get_profile("generic")
    assert "['date','amount']" in generic.prompt(TaskSpec(task=Task.FIELDS, fields=("date", "amount")))
    assert "into French." in generic.prompt(TaskSpec(task=Task.TRANSLATE, target_language="French"))
    assert '"box"' in generic.prompt(SPOT)
    assert all(generic.prompt(TaskSpec(task=t, fields=("k",))) for t in Task)


def test_hunyuan_messages_start_with_an_empty_system_message() -> None:
    messages = get_profile("hunyuanocr-1.0").messages(SPOT, "data:image/jpeg;base64,AAAA")
    assert messages == [
        {"role": "system", "content": ""},
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "data:image/jpeg;base64,AAAA"}},
                {"type": "text", "text": get_profile("hunyuanocr-1.0").prompt(SPOT)},
            ],
        },
    ]


def test_generic_messages_have_no_system_message() -> None:
    messages = get_profile("generic").messages(TaskSpec(task=Task.TEXT), "http://x/a.jpg")
    assert [m["role"] for m in messages] == ["user"]
    assert messages[0]["content"][0] == {"type": "image_url", "image_url": {"url": "http://x/a.jpg"}}


def test_sampling_is_greedy() -> None:
    assert get_profile("hunyuanocr-1.0").sampling(SPOT, max_tokens=4096) == {
        "temperature": 0.0,
        "top_k": 1,
        "repetition_penalty": 1.0,
        "max_tokens": 4096,
    }
    # As the official 1.5 client sends it (inference/vLLM/infer_vllm_client.py).
    assert get_profile("hunyuanocr-1.5").sampling(SPOT, max_tokens=4096) == {
        "temperature": 0.0,
        "top_k": -1,
        "top_p": 1.0,
        "repetition_penalty": 1.08,
        "max_tokens": 4096,
        "skip_special_tokens": True,
    }


def test_a_retry_asks_for_a_stronger_penalty_and_may_raise_the_temperature() -> None:
    retry = get_profile("hunyuanocr-1.0").sampling(SPOT, max_tokens=100, repetition_penalty=1.15)
    assert (retry["repetition_penalty"], retry["temperature"], retry["top_k"]) == (1.15, 0.0, 1)
    warm = get_profile("hunyuanocr-1.0").sampling(SPOT, max_tokens=100, repetition_penalty=1.2, temperature=0.3)
    assert (warm["temperature"], warm["top_k"]) == (0.3, -1)  # top_k 1 would make any temperature greedy


# --- repetition clean-up -----------------------------------------------------------------------


def test_clean_repetition_cuts_a_long_repeated_tail_to_one_copy() -> None:
    head = "".join(f"line {i}\n" for i in range(1200))  # ~9,000 characters, no repetition
    assert clean_repetition(head + "abc" * 30, min_chars=8000) == head + "abc"
    assert clean_repetition(head, min_chars=8000) == head


def test_clean_repetition_leaves_short_or_rare_repetition_alone() -> None:
    assert clean_repetition("ab" * 500, min_chars=2000) == "ab" * 500  # too short
    text = "x" * 2000 + "-".join("abcdefghij") + "hello" * 9
    assert clean_repetition(text, min_chars=2000) == text  # "hello" only 9 times; x-run isn't the tail


def test_the_threshold_differs_between_hunyuan_versions() -> None:
    raw = "".join(f"row {i}\n" for i in range(300)) + "(1,2),(3,4)" * 40  # ~2,500 characters
    text = TaskSpec(task=Task.TEXT)
    kept = get_profile("hunyuanocr-1.0").parse(raw, text, image_width=W, image_height=H, finish_reason=None)
    assert kept.text == raw.strip()
    cut = get_profile("hunyuanocr-1.5").parse(raw, text, image_width=W, image_height=H, finish_reason=None)
    assert cut.text.endswith("row 299\n(1,2),(3,4)") and cut.raw == raw


@given(st.text(alphabet="ab\n", max_size=300), st.text(alphabet="abc", min_size=2, max_size=5))
@settings(max_examples=150, deadline=None)
def test_clean_repetition_only_ever_cuts_the_tail(head: str, unit: str) -> None:
    text = head + unit * 12
    cleaned = clean_repetition(text, min_chars=0)
    assert text.startswith(cleaned)
    assert len(cleaned) <= len(head) + len(unit)


# --- spotting ----------------------------------------------------------------------------------


def test_hunyuan_spotting_format_gives_pixel_quads_in_order(profile: Profile) -> None:
    out = spot(profile, "Invoice(100,50),(500,100)Total: 12.00(100,900),(250,950)")
    assert [line.text for line in out.lines] == ["Invoice", "Total: 12.00"]
    assert out.lines[0].quad == [(80.0, 30.0), (400.0, 30.0), (400.0, 60.0), (80.0, 60.0)]
    assert out.lines[1].quad == [(80.0, 540.0), (200.0, 540.0), (200.0, 570.0), (80.0, 570.0)]
    assert all(line.confidence is None for line in out.lines)
    assert out.text == "Invoice\nTotal: 12.00"
    assert not out.truncated


def test_json_spotting_format(profile: Profile) -> None:
    raw = '```json\n[{"box": [0, 0, 1000, 500], "text": "Top half"}, {"bbox": [10, 600, 20, 700], "text": 7}]\n```'
    out = spot(profile, raw)
    assert [line.text for line in out.lines] == ["Top half", "7"]
    assert out.lines[0].quad == [(0.0, 0.0), (800.0, 0.0), (800.0, 300.0), (0.0, 300.0)]


def test_text_with_parentheses_stays_whole() -> None:
    lines = parse_spotting("ATLANTA (AP) Second(1,2),(3,4)Amount (net)(5,6),(7,8)", width=1000, height=1000)
    assert [line.text for line in lines] == ["ATLANTA (AP) Second", "Amount (net)"]


def test_truncated_spotting_keeps_the_complete_lines(profile: Profile) -> None:
    out = spot(profile, "First(10,10),(200,40)Second(10,50),(200,80)Thi(10,9", finish_reason="length")
    assert [line.text for line in out.lines] == ["First", "Second"]
    assert out.truncated


def test_truncated_json_spotting_keeps_the_complete_items() -> None:
    raw = '[{"box": [1, 2, 3, 4], "text": "a"}, {"box": [5, 6, 7, 8], "text": "b"}, {"box": [9, 10'
    assert [line.text for line in parse_spotting(raw, width=W, height=H)] == ["a", "b"]


def test_malformed_boxes_are_clamped_sorted_or_skipped() -> None:
    raw = "Big(1200,-5),(3000,400)Swapped(900,800),(100,200)\n, (1,2),(3,4)Fine(0,0),(10,10)"
    lines = parse_spotting(raw, width=W, height=H)
    assert [line.text for line in lines] == ["Big", "Swapped", "Fine"]
    assert lines[0].quad == [(800.0, 0.0), (800.0, 0.0), (800.0, 240.0), (800.0, 240.0)]
    assert lines[1].quad == [(80.0, 120.0), (720.0, 120.0), (720.0, 480.0), (80.0, 480.0)]


def test_bad_json_items_are_skipped() -> None:
    raw = json.dumps(
        [
            {"box": [1, 2, 3], "text": "three numbers"},
            {"box": [1, 2, 3, "x"], "text": "a string"},
            {"box": [1, 2, 3, True], "text": "a bool"},
            {"box": [1, 2, 3, 4]},
            {"box": [1, 2, 3, 4], "text": "   "},
            {"box": [1, 2, 3, 4], "text": "kept"},
        ]
    )
    raw = raw[:-1] + ', {"box": [NaN, 0, 1, 1], "text": "nan"}, {"box": [1e999, 0, 1, 1], "text": "inf"}]'
    raw += "garbage {not json"
    assert [line.text for line in parse_spotting(raw, width=W, height=H)] == ["kept"]
    assert box_to_quad([float("nan"), 0, 1, 1], width=W, height=H) is None


def test_spotting_without_boxes(profile: Profile) -> None:
    out = spot(profile, "Just some text\n\nand another line")
    if profile.lines_from_text:
        assert [(line.text, line.quad) for line in out.lines] == [
            ("Just some text", None),
            ("and another line", None),
        ]
    else:
        assert out.lines == [] and out.text == ""
    assert out.raw == "Just some text\n\nand another line"


_LINE_TEXT = (
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters="(){}"),
        min_size=1,
        max_size=20,
    )
    .map(str.strip)
    .filter(lambda t: any(c not in " ,\u3000" and not c.isspace() for c in t))
)
_COORD = st.integers(min_value=0, max_value=1000)
_ITEM = st.tuples(_LINE_TEXT, _COORD, _COORD, _COORD, _COORD)


def _expected_quad(x1: int, y1: int, x2: int, y2: int, w: int, h: int) -> list[tuple[float, float]]:
    left, right = (round(v * w / 1000, 1) for v in sorted((x1, x2)))
    top, bottom = (round(v * h / 1000, 1) for v in sorted((y1, y2)))
    return [(left, top), (right, top), (right, bottom), (left, bottom)]


@given(st.lists(_ITEM, max_size=15), st.integers(1, 5000), st.integers(1, 5000), st.booleans())
@settings(max_examples=150, deadline=None)
def test_well_formed_spotting_round_trips(
    items: list[tuple[str, int, int, int, int]], w: int, h: int, as_json: bool
) -> None:
    if as_json:
        raw = json.dumps([{"box": list(box), "text": text} for text, *box in items], ensure_ascii=False)
    else:
        raw = "".join(f"{text}({x1},{y1}),({x2},{y2})" for text, x1, y1, x2, y2 in items)
    out = get_profile("hunyuanocr-1.5").parse(raw, SPOT, image_width=w, image_height=h, finish_reason="stop")
    assert [line.text for line in out.lines] == [text for text, *_ in items]
    assert [line.quad for line in out.lines] == [_expected_quad(a, b, c, d, w, h) for _, a, b, c, d in items]
    assert out.text == "\n".join(text for text, *_ in items)


_NOISY = st.one_of(
    st.text(max_size=300),
    st.text(alphabet='ab(),0123456789-.{}[]":box text\n', max_size=300),
    st.lists(_ITEM, max_size=5)
    .map(lambda xs: "".join(f"{t}({a},{b}),({c},{d})" for t, a, b, c, d in xs))
    .flatmap(lambda s: st.integers(0, len(s)).map(lambda cut: s[:cut])),
)


@given(_NOISY, st.integers(1, 4000), st.integers(1, 4000), st.sampled_from(sorted(PROFILES)))
@settings(max_examples=300, deadline=None)
def test_spotting_never_raises_and_every_quad_lies_inside_the_image(
    raw: str, w: int, h: int, name: str
) -> None:
    out = get_profile(name).parse(raw, SPOT, image_width=w, image_height=h, finish_reason="length")
    assert out.truncated and out.raw == raw
    for line in out.lines:
        assert line.text.strip()
        if line.quad is None:
            continue
        (x0, y0), (x1, y1), (x2, y2), (x3, y3) = line.quad
        assert all(0 <= x <= w for x in (x0, x1, x2, x3)) and all(0 <= y <= h for y in (y0, y1, y2, y3))
        assert x0 == x3 <= x1 == x2 and y0 == y1 <= y2 == y3  # clockwise from the top-left


# --- fields ------------------------------------------------------------------------------------

FIELDS = TaskSpec(task=Task.FIELDS, fields=("name", "total", "date"))


def _fields(profile: Profile, raw: str, finish_reason: str | None = "stop") -> EngineOutput:
    return profile.parse(raw, FIELDS, image_width=W, image_height=H, finish_reason=finish_reason)


@pytest.mark.parametrize(
    "raw",
    [
        '{"name": "Ann", "total": "12.00", "date": "2024-01-02"}',
        '```json\n{"name": "Ann", "total": "12.00", "date": "2024-01-02"}\n```',
        'Here is the JSON you asked for:\n{"name": "Ann", "total": "12.00", "date": "2024-01-02"}\nThanks!}}',
        'Format {like this}: {"Name ": "Ann", "TOTAL": "12.00", "date": "2024-01-02"} trailing',
    ],
)
def test_fields_are_read_from_json_wrapped_in_anything(profile: Profile, raw: str) -> None:
    out = _fields(profile, raw)
    assert out.fields == {"name": "Ann", "total": "12.00", "date": "2024-01-02"}
    assert out.missing_fields == []
    assert out.raw == raw


def test_absent_or_null_fields_are_reported_missing() -> None:
    fields, missing = parse_fields('{"name": "Ann", "total": null, "extra": 1}', ("name", "total", "date"))
    assert fields == {"name": "Ann", "total": None, "extra": 1}
    assert missing == ["total", "date"]


def test_unparseable_fields_raise_an_engine_output_error(profile: Profile) -> None:
    with pytest.raises(EngineOutputError) as caught:
        _fields(profile, "I could not find those fields, sorry.")
    assert "\n" not in str(caught.value) and "no JSON object" in str(caught.value)


def test_truncated_fields_say_so() -> None:
    with pytest.raises(EngineOutputError, match="token limit"):
        _fields(get_profile(), '{"name": {"first": "Ann"}, "total": "12', finish_reason="length")


# --- parse, text, translate --------------------------------------------------------------------


def test_parse_gives_markdown_and_plain_text(profile: Profile) -> None:
    raw = (
        "# Invoice\n\nDear A &amp; B,\n\n"
        "<table><tr><th>Item</th><th>Cost</th></tr><tr><td>Tea</td><td>3</td></tr></table>\n\n$x^2$"
    )
    out = profile.parse(raw, TaskSpec(task=Task.PARSE), image_width=W, image_height=H, finish_reason=None)
    assert out.markdown == raw
    assert out.text == "Invoice\n\nDear A & B,\n\nItem\tCost\nTea\t3\n\n$x^2$"
    assert not out.truncated


def test_markdown_to_text_handles_line_breaks() -> None:
    assert markdown_to_text("## Title\nline one<br>line two<br/>") == "Title\nline one\nline two"


@pytest.mark.parametrize("task", [Task.TEXT, Task.TRANSLATE])
def test_text_and_translate_give_text(profile: Profile, task: Task) -> None:
    spec = TaskSpec(task=task, target_language="German")
    out = profile.parse(
        "  Hallo Welt\nZeile 2 \n", spec, image_width=W, image_height=H, finish_reason="length"
    )
    assert out.text == "Hallo Welt\nZeile 2"
    assert out.truncated and out.raw == "  Hallo Welt\nZeile 2 \n"


def test_strip_fence_unwraps_one_block_only() -> None:
    assert strip_fence("```markdown\n# Title\ntext\n```") == "# Title\ntext"
    assert strip_fence("before\n```\ncode\n```") == "before\n```\ncode\n```"


# --- HunyuanOCR 1.5's official answer formats ----------------------------------------------------


def _read(task: Task, raw: str, profile: str = "hunyuanocr-1.5") -> EngineOutput:
    return get_profile(profile).parse(raw, TaskSpec(task=task), image_width=W, image_height=H, finish_reason="stop")


def test_15_spotting_json_answer() -> None:
    raw = ('```json\n[{"box": [100, 50, 500, 100], "text": "发票号码 42609332"}, '
           '{"box": [100, 900, 250, 950], "text": "总金额 ￥77.10元"}]\n```')
    out = _read(Task.SPOTTING, raw)
    assert [line.text for line in out.lines] == ["发票号码 42609332", "总金额 ￥77.10元"]
    assert out.lines[0].quad == [(80.0, 30.0), (400.0, 30.0), (400.0, 60.0), (80.0, 60.0)]


def test_15_table_answer_is_html_with_its_text() -> None:
    out = _read(Task.TABLE, "<table><tr><td>项目</td><td>金额</td></tr><tr><td>Tea</td><td>3.00</td></tr></table>")
    assert out.markdown and out.markdown.startswith("<table>")
    assert out.text == "项目\t金额\nTea\t3.00"


@pytest.mark.parametrize("raw", ["$$\n\\frac{a}{b} = c\n$$", "\\[ \\frac{a}{b} = c \\]", "$\\frac{a}{b} = c$",
                                 "```latex\n\\frac{a}{b} = c\n```", "\\frac{a}{b} = c"])
def test_15_formula_answer_is_latex(raw: str) -> None:
    out = _read(Task.FORMULA, raw)
    assert out.text == "\\frac{a}{b} = c" and out.markdown == "$$\n\\frac{a}{b} = c\n$$"


def test_15_chart_answer_keeps_its_mermaid_fence() -> None:
    raw = "```mermaid\ngraph TD\n    A[开始] --> B[结束]\n```"
    out = _read(Task.CHART, raw)
    assert out.markdown == raw and out.text == "graph TD\n    A[开始] --> B[结束]"
    table = _read(Task.CHART, "| 年份 | 收入 |\n|---|---|\n| 2024 | 12 |")
    assert table.markdown == "| 年份 | 收入 |\n|---|---|\n| 2024 | 12 |"


def test_15_translation_answer_is_text() -> None:
    out = _read(Task.TRANSLATE, "Invoice number 42609332\nTotal 77.10\n")
    assert out.text == "Invoice number 42609332\nTotal 77.10"


def test_15_doc_parse_is_normalised_and_10_is_not() -> None:
    raw = ("# 标题\n\n图1 数据来源(39,337),(512,900)\n\n(147,90),(925,415)\n\n"
           "<table><caption>表1 收入</caption><tr><td>a</td></tr></table>\n\n$\\frac{a}{b}$\n\n"
           "$$ x = 1 \\tag{2} $$")
    out = _read(Task.PARSE, raw)
    assert out.markdown == ("# 标题\n\n图1 数据来源\n\n\n表1 收入\n\n<table><tr><td>a</td></tr></table>\n\n\n\n"
                            "$$ \\frac{a}{b} $$\n\n\n\n$$ x = 1 $$")
    assert _read(Task.PARSE, raw, "hunyuanocr-1.0").markdown == raw
