import pytest

from loadgen.cli import main
from loadgen.output import load_result
from loadgen.sim.records_file import load_records
from tests.loadgen.sim.builders import conversations, write_trace


@pytest.fixture
def trace(tmp_path):
    return write_trace(tmp_path / "trace.jsonl", conversations(40))


def test_sim_writes_the_result_and_plots(trace, tmp_path, capsys):
    out, plots, records = tmp_path / "out.json", tmp_path / "plots", tmp_path / "r.npz"
    code = main(
        [
            "sim",
            "--trace",
            str(trace),
            "--prefill",
            "2",
            "--decode",
            "2",
            "--admission",
            "early",
            "--slo-tbt",
            "0.1",
            "--output-json",
            str(out),
            "--plot-dir",
            str(plots),
            "--label",
            "t",
            "--records",
            str(records),
            "--quiet",
        ]
    )
    assert code == 0
    result = load_result(out)
    sim = result["sim"]
    assert result["num_prompts"] == 40 and result["backend"] == "kvstack-sim"
    assert sim["policy"] == "kvcentric" and sim["nodes"] == {"prefill": 2, "decode": 2}
    assert 0 < sim["hit_ratio"]["global"] <= sim["hit_ratio"]["ceiling"]
    assert sim["hit_ratio"]["local"] <= sim["hit_ratio"]["global"]
    assert len(sim["timeseries"]["time"]) > 10
    # the records go to their own file, as columns; the JSON keeps the run's numbers
    assert not {"records", "itls", "ttfts", "start_times"} & result.keys()
    assert out.stat().st_size < 100_000 and sim["records_file"] == str(records)
    columns = load_records(records)
    assert len(columns["arrival"]) == 40 and "itl" not in columns
    assert set(columns["node_names"][columns["prefill"]]) <= {"prefill-00", "prefill-01"}
    assert (plots / "t-load.png").is_file() and len(list(plots.glob("t-*.png"))) > 1
    assert "cache hits" in capsys.readouterr().out


def test_colocated_defaults_to_round_robin(trace, tmp_path):
    out = tmp_path / "c.json"
    assert (
        main(
            ["sim", "--trace", str(trace), "--colocated", "3", "--output-json", str(out), "--quiet"]
        )
        == 0
    )
    sim = load_result(out)["sim"]
    assert (sim["mode"], sim["policy"]) == ("colocated", "round-robin")
    assert sim["hit_ratio"]["local"] == sim["hit_ratio"]["global"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--prefill", "2", "--colocated", "2"], "either"),
        (["--colocated", "2", "--policy", "kvcentric"], "no KV pool"),
        (["--prefill", "1", "--decode", "1", "--hardware", "cpu"], "--kv-tokens"),
        (["--prefill", "1", "--decode", "1", "--time-scale", "0"], "time scale"),
        (["--prefill", "1", "--decode", "1", "--max-requests", "0"], "no requests"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(trace, capsys, args, message):
    assert main(["sim", "--trace", str(trace), "--quiet", *args]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_trace_is_a_clear_error(tmp_path, capsys):
    assert (
        main(["sim", "--trace", str(tmp_path / "none.jsonl"), "--prefill", "1", "--decode", "1"])
        == 2
    )
    assert "trace file not found" in capsys.readouterr().err


def test_records_itl_needs_records(trace, capsys):
    args = ["sim", "--trace", str(trace), "--prefill", "1", "--decode", "1", "--records-itl"]
    assert main(args) == 2
    assert "--records PATH" in capsys.readouterr().err


def test_sim_without_a_trace_names_both_forms(capsys):
    assert main(["sim", "--prefill", "1", "--decode", "1"]) == 2
    assert "loadgen sim sweep" in capsys.readouterr().err


def test_report_reads_a_sim_result_and_leaves_it_out_of_the_plots(trace, tmp_path, capsys):
    out = tmp_path / "s.json"
    argv = ["sim", "--trace", str(trace), "--prefill", "1", "--decode", "1", "--quiet"]
    assert main([*argv, "--output-json", str(out)]) == 0
    capsys.readouterr()
    assert main(["report", str(out), "--plot-dir", str(tmp_path / "cmp")]) == 0
    printed = capsys.readouterr()
    assert "Mean TTFT (ms)" in printed.out and "not plotted" in printed.err
