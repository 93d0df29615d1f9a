//! The load generator against the server: complete streams counted in
//! every scenario, a run with short streams failed.

use super::*;

/// Runs llama-serve/examples/loadgen against `server` with `--json`: its exit code,
/// its rows, its stderr.
fn loadgen(server: &Server, args: &[&str]) -> (i32, Vec<Value>, String) {
    let out = Command::new(example("loadgen"))
        .args(["--url", &server.base, "--json", "--timeout-s", "120"])
        .args(args)
        .output()
        .unwrap();
    let rows = String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    (out.status.code().unwrap_or(-1), rows, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn the_load_generator_counts_complete_streams_in_every_scenario() {
    let server = Server::start(&[]);
    let (code, rows, err) =
        loadgen(&server, &["--clients", "1,2", "--requests", "2", "--prompt-tokens", "8", "--max-tokens", "6"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(rows.len(), 2);
    for (row, clients) in rows.iter().zip([1u64, 2]) {
        assert_eq!(row["row"], format!("clients/{clients}"));
        assert_eq!(row["requests"], clients * 2, "{row}");
        assert_eq!((row["errors"].as_u64(), row["incomplete"].as_u64()), (Some(0), Some(0)), "{row}");
        assert_eq!(row["output_tokens"], clients * 2 * 6, "{row}");
        assert_eq!(row["without_usage"], 0);
        assert!(row["tok_s"].as_f64().unwrap() > 0.0 && row["ttft_p50_ms"].as_f64().unwrap() > 0.0, "{row}");
        assert!(row["itl_p50_ms"].as_f64().is_some(), "{row}");
    }

    // Every prompt after the first one shares the 100-token system prompt.
    let (code, rows, err) = loadgen(
        &server,
        &["--scenario", "shared-prefix", "--clients", "2", "--requests", "2", "--shared-tokens", "100"]
            .into_iter()
            .chain(["--prompt-tokens", "8", "--max-tokens", "4"])
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!((rows[0]["requests"].as_u64(), rows[0]["output_tokens"].as_u64()), (Some(4), Some(16)), "{}", rows[0]);
    assert_eq!(rows[0]["cached_tokens_p50"], 100, "{}", rows[0]);

    let (code, rows, err) = loadgen(
        &server,
        &["--scenario", "long-short", "--long-tokens", "300", "--long-max-tokens", "3", "--shorts", "2"]
            .into_iter()
            .chain(["--short-tokens", "8", "--short-max-tokens", "5", "--gap-ms", "10"])
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 0, "{err}");
    let row = &rows[0];
    assert_eq!((row["requests"].as_u64(), row["output_tokens"].as_u64()), (Some(3), Some(3 + 2 * 5)), "{row}");
    assert_eq!((row["long"]["requests"].as_u64(), row["short"]["requests"].as_u64()), (Some(1), Some(2)), "{row}");
}

#[test]
fn the_load_generator_fails_a_run_whose_streams_come_back_short() {
    // The server clamps max_tokens to 4: the usage then says 4 where 8 were asked.
    let server = Server::start(&["--max-tokens", "4"]);
    let (code, rows, err) =
        loadgen(&server, &["--clients", "2", "--requests", "1", "--prompt-tokens", "8", "--max-tokens", "8"]);
    assert_eq!(code, 1, "{err}");
    assert_eq!((rows[0]["incomplete"].as_u64(), rows[0]["output_tokens"].as_u64()), (Some(2), Some(0)), "{}", rows[0]);
    assert!(err.contains("usage says 4 completion tokens, asked for 8"), "{err}");
    // A server that is not there is a one-line error, exit 2.
    let out = Command::new(example("loadgen")).args(["--url", "http://localhost:1"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("only http://127.0.0.1:PORT"), "{out:?}");
}
