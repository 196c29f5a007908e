#!/usr/bin/env python3
"""Write the tokenizer parity corpus: one {"name", "text"} JSON object per line.

usage: make_corpus.py OUT.jsonl

Deterministic (no randomness beyond a fixed LCG). Every entry is valid
Unicode without lone surrogates, because JSON is the carrier. Characters where
the JS peer is known to differ from Hugging Face tokenizers (U+0085, U+FEFF,
U+017F after an apostrophe; see README.md) and characters newer than Unicode
14 (Python's NFC tables here) are deliberately left out.
"""
import json
import sys

PROSE = (
    "The quick brown fox jumps over the lazy dog. It wasn't the first time; "
    "the dog, frankly, didn't care. In 1998, researchers at the university "
    "published a 42-page report (see Appendix B) arguing that tokenization "
    "matters more than most people think -- especially for numbers like "
    "3.14159 and 2,718,281, or for words such as \"re-evaluate\" and 'co-op'."
)

CODE_PY = (
    "def fib(n):\n"
    "\tif n < 2:\n"
    "\t\treturn n\n"
    "    # mixed: four spaces here, tabs above\n"
    "\t    return fib(n - 1) + fib(n - 2)  \n"
    "\n"
    "class Foo:\n"
    "    def __init__(self, x=None):\n"
    "        self.x = x or {}\n"
    "\n"
    "if __name__ == \"__main__\":\n"
    "    print(f\"{fib(10)=}\")\n"
)

CODE_C = (
    "#include <stdio.h>\n\n"
    "int main(int argc, char **argv) {\n"
    "    for (int i = 0; i < argc; ++i) {\n"
    "        if (argv[i][0] == '-') { printf(\"flag %s\\n\", argv[i]); }\n"
    "    }\n"
    "    return 0;\n"
    "}\n"
)

CODE_JSON = (
    '{\n  "name": "grpo",\n  "version": [1, 2, 3],\n  "ok": true,\n'
    '  "nested": {"a": null, "b": -1.5e-3, "s": "tab\\there"}\n}'
)


def lcg_letters(n, seed=12345):
    """A long pseudo-random word of a-z; deterministic across Python versions."""
    out, x = [], seed
    for _ in range(n):
        x = (1103515245 * x + 12345) % 2**31
        out.append(chr(ord("a") + (x >> 16) % 26))
    return "".join(out)


def entries():
    e = [
        # --- natural language --------------------------------------------
        ("en_prose", PROSE),
        ("en_short", "Hello world"),
        ("en_sentence_caps", "THE END. The End. the end."),
        ("zh_prose", "我们今天去北京的天安门广场参观，然后在附近的餐厅吃了烤鸭。人工智能正在改变世界。"),
        ("zh_punct_mixed", "你好，世界！这是一个测试（test）：123、456。“引号”和《书名》"),
        ("ja_kana_kanji", "今日は良い天気ですね。カタカナとひらがな、そして漢字を混ぜた文章です。東京タワーに行きました。"),
        ("ja_halfwidth", "ｶﾀｶﾅ ﾃｽﾄ and ｱｲｳｴｵ"),
        ("ko_prose", "안녕하세요. 저는 한국어를 공부하고 있습니다. 오늘 날씨가 정말 좋네요!"),
        ("ar_prose", "مرحبا بالعالم. اللغة العربية تكتب من اليمين إلى اليسار، وفيها أرقام ١٢٣ أيضا."),
        ("hi_devanagari", "नमस्ते दुनिया। हिन्दी भाषा देवनागरी लिपि में लिखी जाती है। क्षत्रिय, ज्ञान, श्री।"),
        ("th_prose", "สวัสดีครับ ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ทำให้การตัดคำเป็นเรื่องยาก"),
        ("ru_prose", "Съешь же ещё этих мягких французских булок, да выпей чаю. Ёлка и ЁЖИК."),
        ("uk_el_he", "Їжак ґанок. Ελληνικά γράμματα: αβγ ΑΒΓ. עברית נכתבת מימין לשמאל."),
        ("vi_prose", "Tiếng Việt có nhiều dấu: ă â đ ê ô ơ ư, và thanh điệu à á ả ã ạ."),
        # --- code ----------------------------------------------------------
        ("code_python_tabs", CODE_PY),
        ("code_c_braces", CODE_C),
        ("code_json", CODE_JSON),
        ("code_shell", "for f in *.txt; do grep -n 'TODO' \"$f\" | wc -l >> /tmp/out.log 2>&1; done && echo $?"),
        ("code_js_arrow", "const f = (a, b) => a ?? b; // nullish\nexport default { f };"),
        ("code_makefile", "all: main.o util.o\n\t$(CC) -o $@ $^ $(LDFLAGS)\n\n%.o: %.c\n\t$(CC) -c $<\n"),
        ("code_deep_indent", "\n".join(" " * (4 * i) + f"x{i} = {i}" for i in range(8))),
        # --- digits / numbers --------------------------------------------
        ("digits_40", "1234567890123456789012345678901234567890"),
        ("numbers_commas_decimals", "1,234,567.89 and 0.000001 and -42.5 and 6.022e23 and 1e-9"),
        ("numbers_mixed", "Call 555-0199 or +1 (800) 123-4567 before 2024-12-31T23:59:59Z; v1.2.3"),
        ("numbers_other_scripts", "٣٤٥ ١٢٣ ४५६ 一二三 ⅫⅣ x² ½ 第3章 ９９"),
        # --- whitespace: the \s+(?!\S) and \s*[\r\n]+ rules --------------
        ("newlines_3", "\n\n\n"),
        ("newlines_between", "a\n\n\nb"),
        ("crlf", "line one\r\nline two\r\n\r\nend\r\n"),
        ("lone_cr", "a\rb\r\rc"),
        ("space_newline_space", " \n \n"),
        ("trailing_spaces_newline", "trailing   \nnext line  \n  indented\n"),
        ("spaces_tabs_newline_word", " \t \n y"),
        ("spaces_only_long", " " * 40),
        ("spaces_then_newline_long", " " * 17 + "\n" + " " * 3),
        ("newlines_20", "\n" * 20),
        ("tabs_only", "\t\t\t"),
        ("tabs_columns", "col1\tcol2\tcol3\nv1\t\tv3\n"),
        ("tab_space_mix", "a  \tb\t  c \t d"),
        ("unicode_spaces", "a\u00a0b\u00a0\u00a0c\u3000d\u2009e\u202ff\u2028g\u2029h"),
        ("vt_ff", "a\u000bb\u000cc \u000b\u000c d"),
        ("zero_width", "zero\u200bwidth\u200cnon\u200djoiner"),
        ("control_chars", "bell\u0007 esc\u001b[0m del\u007f"),
        ("nul_char", "a\u0000b"),
        # --- emoji -----------------------------------------------------------
        ("emoji_basic", "I love it 😀😃😄 ❤️ ✨ 🎉!"),
        ("emoji_skin_tone", "👍🏽 thumbs up, 👋🏿 wave, 🧑🏻‍💻 coder"),
        ("emoji_zwj_family", "family: 👨‍👩‍👧‍👦 and 👩‍❤️‍💋‍👨"),
        ("emoji_flags", "flags 🇺🇸🇯🇵🇩🇪🇨🇳 🏳️‍🌈 🏴‍☠️"),
        ("emoji_keycap", "1️⃣ 2️⃣ #️⃣ ©️ ®️ ™️"),
        ("astral_letters", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝐛𝐨𝐥𝐝 𠜎𠜱𠝹 𓀀"),
        # --- NFC normalizer -------------------------------------------------
        ("nfc_e_acute", "cafe\u0301 vs caf\u00e9"),
        ("nfc_a_ring", "A\u030a and \u212b (angstrom sign) and \u00c5"),
        ("nfc_ohm", "\u2126 ohm vs \u03a9 omega"),
        ("nfc_hangul_jamo", "\u1112\u1161\u11ab\u1100\u1173\u11af \u1100\u1161\u11a8 \uac00\u11a8"),
        ("nfc_reorder_marks", "q\u0307\u0323 \u1e9b\u0323 o\u0308\u0304"),
        ("nfc_vietnamese", "Vie\u0323\u0302t Nam, tie\u0301ng Vie\u0323\u0302t"),
        ("nfc_devanagari_nukta", "\u0915\u093c \u0958"),
        ("combining_only", "\u0301\u0301x\u0308"),
        # --- contractions (case-insensitive group) -------------------------
        ("contractions_mixed_case", "I'M sure You'Re right, but DON'T say it's over. We'LL see; they'VE gone, she'D know."),
        ("contractions_edge", "'s 'S 'll 'LL rock 'n' roll O'Neil's y'all 'twas ''s"),
        ("contractions_curly", "it\u2019s not a straight apostrophe, don\u2019t"),
        # --- added tokens inside text ----------------------------------------
        ("special_chatml", "<|im_start|>user\nhi<|im_end|>"),
        ("special_glued", "foo<|endoftext|>bar<|endoftext|><|endoftext|>baz"),
        ("special_spaced", " <|im_end|> \n<|im_start|> assistant"),
        ("special_adjacent", "<|im_start|><|im_end|><|im_start|>"),
        ("think_tokens", "<think>\nLet me reason.\n</think>\n\nThe answer is 4."),
        ("think_lookalikes", "<thinking> <Think> </think > <think"),
        ("special_partial", "<|im_start| <|im_end <|endoftext|"),
        ("special_nested", "<<|im_start|>> <|<|im_end|>|>"),
        ("special_case", "<|IM_START|> <|Endoftext|>"),
        ("tool_call_tokens", '<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'),
        ("fim_tokens", "<|fim_prefix|>def f():\n<|fim_suffix|>\n    return 1<|fim_middle|>"),
        ("vision_tokens", "<|vision_start|><|image_pad|><|image_pad|><|vision_end|>describe"),
        # --- math --------------------------------------------------------------
        ("gsm8k_answer", "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether.\n#### 72"),
        ("gsm8k_hashes", "#### 42"),
        ("latex_boxed", "So the final answer is $\\boxed{3}$."),
        ("latex_math", "$$\\frac{1}{2} + \\sqrt{x^2 + y^2} = \\int_0^\\infty e^{-t}\\,dt$$"),
        ("arith", "3 * (4 - 1) / 2 = 4.5; 2^10=1024; 7%3==1"),
        # --- punctuation, urls, ascii --------------------------------------
        ("punct_runs", "Wait... what?!?! -- no --- way!!! (((nested))) [[x]] {{y}} ;;; ::"),
        ("punct_unicode", "\u00bfQu\u00e9? \u00a1S\u00ed! \u2014 \u2013 \u2026 \u00ab guillemets \u00bb \u201cquotes\u201d"),
        ("punct_newline_runs", "end.\n\n\n?!\n\r\n"),
        ("url", "See https://example.com/path/to/page?q=1&r=two#frag or www.test.co.uk/a_b-c."),
        ("email", "mailto:someone.else+tag@example.org"),
        ("ascii_printable", "".join(chr(i) for i in range(32, 127))),
        ("markdown", "# Title\n\n- item 1\n- item 2\n\n```python\nprint('hi')\n```\n\n| a | b |\n|---|---|\n"),
        # --- mixed scripts / long words ------------------------------------
        ("mixed_script_word", "hello\u043f\u0440\u0438\u0432\u0435\u0442\u4e16\u754c abc\u03b1\u03b2\u03b3 Tokyo\u6771\u4eac2020"),
        ("mixed_latin_diacritics", "na\u00efvet\u00e9 r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u0141\u00f3d\u017a"),
        ("repeated_letter", "a" * 64),
        ("repeated_punct", "=" * 50 + "\n" + "-" * 33),
        ("long_word_5000", lcg_letters(5000)),
        # --- tiny inputs ------------------------------------------------------
        ("empty", ""),
        ("single_space", " "),
        ("lone_newline", "\n"),
        ("single_letter", "x"),
        ("single_digit", "7"),
        ("single_cjk", "\u4e2d"),
    ]
    # 1..9 spaces before a word, at the end of a line, and between words.
    for n in range(1, 10):
        s = " " * n
        e.append((f"spaces_before_word_{n}", s + "word"))
        e.append((f"spaces_end_of_line_{n}", "word" + s + "\nnext"))
        e.append((f"spaces_between_{n}", "a" + s + "b" + s))
    return e


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_corpus.py OUT.jsonl")
    ents = entries()
    names = [n for n, _ in ents]
    assert len(names) == len(set(names)), "duplicate entry names"
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        for name, text in ents:
            # ensure_ascii=False: the carrier holds raw UTF-8, as most JSONL does.
            f.write(json.dumps({"name": name, "text": text}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
