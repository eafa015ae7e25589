"""assistant.runtime.bench.format_table: the printed summary of a bench report."""
from assistant.runtime.bench import format_table


def _report(methods: dict) -> dict:
    return {"target": "t", "dtype": "fp32", "device": "cpu", "machine": "m", "methods": methods}


def test_table_without_hf_prints_a_dash_not_nan():
    out = format_table(_report({"greedy": {"tokens_per_pass": 1.0, "tokens_per_second": 12.0},
                                "phrase": {"tokens_per_pass": 1.5, "tokens_per_second": 10.0}}))
    rows = out.splitlines()[2:]
    assert "nan" not in out
    assert rows[0].split() == ["greedy", "1.00", "12.00", "-", "-", "-"]
    assert rows[1].split() == ["phrase", "1.50", "10.00", "-", "-", "-"]


def test_table_with_hf_prints_ratios():
    out = format_table(_report({"hf": {"tokens_per_pass": 1.0, "tokens_per_second": 8.0, "speedup_vs_hf": 1.0,
                                       "exact_match_vs_hf": 1.0},
                                "phrase": {"tokens_per_pass": 2.5, "tokens_per_second": 12.0, "speedup_vs_hf": 1.5,
                                           "exact_match_vs_hf": 0.8}}))
    assert out.splitlines()[3].split() == ["phrase", "2.50", "12.00", "1.50x", "0.80", "-"]


def test_table_prints_the_share_of_answers_equal_to_our_greedy():
    out = format_table(_report({"greedy": {"tokens_per_pass": 1.0, "tokens_per_second": 12.0},
                                "phrase": {"tokens_per_pass": 2.5, "tokens_per_second": 20.0, "same_as_greedy": 1.0}}))
    assert out.splitlines()[1].split()[-1] == "=greedy"
    assert out.splitlines()[3].split() == ["phrase", "2.50", "20.00", "-", "-", "1.00"]


def test_header_names_the_native_kernels_build():
    report = dict(_report({"greedy": {"tokens_per_pass": 1.0, "tokens_per_second": 12.0}}), kernels="avx2",
                  cpu_flags="avx2 fma")
    assert format_table(report).splitlines()[0].endswith("engine eager; kernels avx2; cpu flags: avx2 fma)")


def test_table_names_the_source_of_the_drafted_tokens():
    out = format_table(_report({"phrase": {"tokens_per_pass": 2.0, "tokens_per_second": 10.0,
                                           "banked_by_source": {"phrase": 30, "prompt": 10}}}))
    assert "drafted tokens of phrase by source: phrase 30 (75%), prompt 10 (25%)" in out


def test_a_history_run_adds_each_answer_to_the_index_as_a_session_does(tiny_target):
    from assistant.runtime.bench import BenchConfig, run_bench
    from assistant.runtime.drafters import UnionDrafter
    from assistant.runtime.history_lookup import AnswerIndex, HistoryDrafter

    index = AnswerIndex()
    drafter = UnionDrafter(HistoryDrafter(index))
    prompts = [{"id": "a", "prompt": "tell me"}, {"id": "b", "prompt": "tell me"}]
    cfg = BenchConfig(max_new_tokens=24, methods=("greedy", "phrase"), tree_width=8, ignore_eos=True)
    rep = run_bench(tiny_target, prompts, cfg, {"phrase": drafter}, history=index)
    first, second = [r for r in rep["per_prompt"] if r["method"] == "phrase"]
    assert len(index) == len(first["tokens"]) + 1 + len(second["tokens"]) + 1    # each answer, then a separator
    assert second["tokens"] == first["tokens"]
    assert first["same_as_greedy"] and second["same_as_greedy"]        # fp32: the drafted answer is greedy's
    assert rep["methods"]["phrase"]["same_as_greedy"] == 1.0 and "same_as_greedy" not in rep["methods"]["greedy"]
    # the same question again: the second answer is copied from the first one
    assert second["forward_passes"] < first["forward_passes"]
    assert rep["methods"]["phrase"]["banked_by_source"]["history"] > 0


def test_the_report_records_the_verify_costs_that_chose_the_widths(tiny_target):
    from assistant.runtime.bench import BenchConfig, relative_costs, run_bench
    from assistant.runtime.drafters import PromptLookupDrafter, UnionDrafter

    costs = ((1, 0.02), (2, 0.021), (4, 0.025), (8, 0.04))
    prompts = [{"id": "a", "prompt": "count to ten"}]
    cfg = BenchConfig(max_new_tokens=8, methods=("phrase",), tree_width=8, ignore_eos=True, width_costs=costs)
    rep = run_bench(tiny_target, prompts, cfg, {"phrase": UnionDrafter(PromptLookupDrafter())})
    assert rep["config"]["verify_costs"] == {"1": 1.0, "2": 1.05, "4": 1.25, "8": 2.0}
    # a fixed width records no table
    assert relative_costs(()) == {}
