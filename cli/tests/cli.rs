//! The `cxlkv` binary: exit codes, human and JSON output, and no crash on
//! any file content.

use std::process::{Command, Output};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const BIN: &str = env!("CARGO_BIN_EXE_cxlkv");

fn run(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn path(tag: &str) -> String {
    format!("/dev/shm/cxlkv-cli-{tag}-{}", std::process::id())
}

#[test]
fn format_inspect_check_recover_round_trip() {
    let p = path("ok");
    let o = run(&["format", &p, "--size", "48M", "--chunk", "256K", "--entries", "8192", "--nodes", "8"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(&["inspect", &p]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).contains("8 nodes"));
    let o = run(&["inspect", &p, "--json"]);
    let s = String::from_utf8_lossy(&o.stdout);
    assert!(s.contains("\"chunk_size\": 262144") && s.contains("\"entries\": 8192"), "{s}");
    let o = run(&["check", &p]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "clean");
    let o = run(&["recover", &p, "--json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"nodes_freed\":0"));
    // No silent overwrite; an impossible size leaves the old region intact.
    assert_eq!(run(&["format", &p, "--size", "48M"]).status.code(), Some(1));
    assert_eq!(run(&["format", &p, "--size", "1K", "--force"]).status.code(), Some(1));
    assert_eq!(run(&["check", &p]).status.code(), Some(0));
    let _ = std::fs::remove_file(&p);
}

/// `cxlkv inspect R --json | head -1` and `cxlkv check R | head -1`: the
/// reader closes the pipe after a line; the command ends quietly.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    let p = path("pipe");
    assert!(run(&["format", &p, "--size", "16M", "--chunk", "64K", "--entries", "1024"]).status.success());
    for args in [vec!["inspect", &p, "--json"], vec!["check", &p, "--json"], vec!["stats", &p, "--prometheus"]] {
        let mut child = Command::new(BIN).args(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        // Read nothing: close the pipe at once, so every write fails.
        drop(child.stdout.take());
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        let st = child.wait().unwrap();
        assert_eq!(st.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?} printed: {err}");
    }
    let _ = std::fs::remove_file(&p);
}

#[test]
fn every_subcommand_takes_help() {
    for cmd in ["demo", "format", "inspect", "check", "recover", "bench", "gpu-check"] {
        let o = run(&[cmd, "--help"]);
        assert_eq!(o.status.code(), Some(0), "{cmd} --help");
        assert!(String::from_utf8_lossy(&o.stdout).contains("Usage: cxlkv"), "{cmd} --help");
    }
}

/// Without a GPU (or libcuda) it says so with its own status, never a crash;
/// with one, every check passes.
#[test]
fn gpu_check_passes_or_reports_cuda_unavailable() {
    let o = run(&["gpu-check", "--quick"]);
    let out = String::from_utf8_lossy(&o.stdout);
    match o.status.code() {
        Some(0) => {}
        Some(2) => assert!(out.contains("CUDA unavailable"), "{out}"),
        other => panic!("gpu-check exited {other:?}: {out}"),
    }
    assert_eq!(run(&["gpu-check", "--device"]).status.code(), Some(2));
}

#[test]
fn check_exit_codes_for_findings_and_unopenable_files() {
    let p = path("bad");
    assert!(run(&["format", &p, "--size", "16M", "--chunk", "64K", "--entries", "1024"]).status.success());
    // Scribble over the entry area: findings, exit 1.
    let mut b = std::fs::read(&p).unwrap();
    let word = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap()) as usize;
    let (buckets, journals) = (word(144), word(160));
    for (i, x) in b[buckets..journals].iter_mut().enumerate() {
        *x = (i as u8).wrapping_mul(37) ^ 0x5a;
    }
    std::fs::write(&p, &b).unwrap();
    let o = run(&["check", &p]);
    assert_eq!(o.status.code(), Some(1), "{}", String::from_utf8_lossy(&o.stdout));
    let o = run(&["check", &p, "--json"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("\"ok\":false"));
    // Recovery repairs it.
    assert!(run(&["recover", &p]).status.success());
    assert_eq!(run(&["check", &p]).status.code(), Some(0));
    // Not a region / missing / too small: exit 2.
    std::fs::write(&p, vec![7u8; 1 << 20]).unwrap();
    assert_eq!(run(&["check", &p]).status.code(), Some(2));
    std::fs::write(&p, [1u8; 10]).unwrap();
    assert_eq!(run(&["check", &p]).status.code(), Some(2));
    assert_eq!(run(&["check", "/nonexistent/region"]).status.code(), Some(2));
    assert_eq!(run(&["check"]).status.code(), Some(2));
    let _ = std::fs::remove_file(&p);
}

#[test]
fn check_never_crashes_on_random_bytes_behind_a_valid_header() {
    let p = path("fuzz");
    assert!(run(&["format", &p, "--size", "8M", "--chunk", "64K", "--entries", "512"]).status.success());
    let good = std::fs::read(&p).unwrap();
    let mut rng = SmallRng::seed_from_u64(0x1234_5678_9abc_def0);
    for round in 0..6 {
        let mut b = good.clone();
        for _ in 0..2000 {
            let i = rng.random_range(4096..b.len() / 4);
            b[i] = rng.random();
        }
        std::fs::write(&p, &b).unwrap();
        let code = run(&["check", &p]).status.code();
        assert!(matches!(code, Some(0 | 1)), "round {round}: {code:?}");
        assert!(run(&["inspect", &p]).status.success(), "round {round}");
    }
    let _ = std::fs::remove_file(&p);
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(run(&[]).status.code(), Some(2));
    assert_eq!(run(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(run(&["format", "/dev/shm/x", "--size", "ten"]).status.code(), Some(2));
    assert_eq!(run(&["inspect", "/dev/shm/x", "--bogus"]).status.code(), Some(2));
}

/// `format --force` never erases a region under a running node (it names
/// it, and the node's blocks stay), and never truncates a file a process
/// still maps: the old mapping stays readable after a smaller format.
#[test]
fn format_refuses_live_nodes_and_never_truncates_a_mapped_file() {
    use cxlkv_platform::kv::Key;
    use cxlkv_platform::{FlushMode, GetItem, Options, PutItem, Region};
    let p = path("live");
    let local = format!("{p}.local");
    std::fs::create_dir_all(&local).unwrap();
    assert!(run(&["format", &p, "--size", "32M", "--chunk", "64K", "--entries", "1024"]).status.success());
    let region = Region::open(std::path::Path::new(&p)).unwrap();
    let opts = Options { mode: FlushMode::Coherent, local_dir: local.clone().into(), ..Options::default() };
    let node = region.attach(opts).unwrap();
    let key = Key { lo: 7, hi: 7 };
    let payload = vec![0x5au8; 4096];
    let mut out = [Ok(())];
    node.put(1, &[PutItem { key, tokens: 1, parts: &[&payload[..]] }], &mut out).unwrap();
    out[0].unwrap();
    for size in ["32M", "16M"] {
        let o = run(&["format", &p, "--size", size, "--force"]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("may still run") && err.contains("node 0 (pid"), "{err}");
    }
    let mut buf = vec![0u8; 4096];
    let (mut lens, mut res) = ([0u64], [Ok(())]);
    let mut parts = [&mut buf[..]];
    node.get(1, &mut [GetItem { key, parts: &mut parts }], &mut lens, &mut res).unwrap();
    assert!(res[0].is_ok() && buf == payload, "the block survived the refused formats");
    node.close().unwrap();
    // No node runs now; this process still maps the 32 MiB file.
    let o = run(&["format", &p, "--size", "16M", "--chunk", "64K", "--entries", "1024", "--force"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::metadata(&p).unwrap().len(), 16 << 20);
    let old = region.mapping().view();
    assert_eq!(old.len(), 32 << 20);
    // Past the new file's end: a truncated mapping would kill us here.
    old.load_u64(old.len() - 8).unwrap();
    assert_eq!(run(&["check", &p]).status.code(), Some(0));
    drop(region);
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_dir_all(&local);
}

/// Errors say what would have worked, and help shows every default.
#[test]
fn errors_name_what_works_and_help_shows_defaults() {
    let o = run(&["inspect", "/dev/shm/none", "--mode", "nonsense"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("not a flush mode: nonsense") && err.contains("clflushopt") && err.contains("auto"), "{err}");
    let p = path("small");
    let o = run(&["format", &p, "--size", "64K"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("too small") && err.contains("at least") && err.contains("MiB"), "{err}");
    // The minimum it names is enough, and one byte less is not.
    let min: u64 = err.split('(').nth(1).and_then(|t| t.split(' ').next()).and_then(|n| n.parse().ok()).unwrap();
    assert!(!std::path::Path::new(&p).exists(), "a refused format created the file");
    assert!(run(&["format", &p, "--size", &min.to_string()]).status.success());
    let _ = std::fs::remove_file(&p);
    assert_eq!(run(&["format", &p, "--size", &(min - 1).to_string()]).status.code(), Some(1));
    // A check of a tier directory that is not one names it.
    assert!(run(&["format", &p, "--size", "16M", "--chunk", "64K", "--entries", "1024"]).status.success());
    let o = run(&["check", &p, "--tier", "/var/tmp/cxlkv-no-such-tier-dir"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_ne!(o.status.code(), Some(0));
    assert!(err.contains("/var/tmp/cxlkv-no-such-tier-dir"), "{err}");
    let _ = std::fs::remove_file(&p);
    let help = String::from_utf8_lossy(&run(&["format", "--help"]).stdout).to_string();
    for want in
        ["[default: 16]", "[default: 2M]", "[default: 64]", "[default: 512]", "[default: 8192]", "[default: 256]"]
    {
        assert!(help.contains(want), "format --help lacks {want}:\n{help}");
    }
}

/// `cxlkv top --once`: the region's line, and each node's with its state
/// and what it did during the interval.
#[test]
fn top_once_shows_each_node_and_its_rates() {
    use cxlkv_platform::kv::Key;
    use cxlkv_platform::{FlushMode, Options, PutItem, Region};
    let p = path("top");
    let local = format!("{p}.local");
    std::fs::create_dir_all(&local).unwrap();
    assert!(run(&["format", &p, "--size", "32M", "--chunk", "64K", "--entries", "4096"]).status.success());
    let o = run(&["top", &p, "--once", "--interval", "0.1"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success() && out.contains("0 live blocks") && out.contains("(no node attached)"), "{out}");
    let region = Region::open(std::path::Path::new(&p)).unwrap();
    let opts = Options { mode: FlushMode::Coherent, local_dir: local.clone().into(), ..Options::default() };
    let node = region.attach(opts).unwrap();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let out = std::thread::scope(|s| {
        let node = &node;
        s.spawn(move || {
            let body = vec![7u8; 4096];
            let mut i = 0u64;
            while stopped.try_recv() == Err(std::sync::mpsc::TryRecvError::Empty) {
                let mut r = [Ok(())];
                let _ = node.put(1, &[PutItem { key: Key { lo: i, hi: 1 }, tokens: 1, parts: &[&body[..]] }], &mut r);
                i = (i + 1) % 2000;
            }
        });
        let o = run(&["top", &p, "--once", "--interval", "1"]);
        let _ = stop.send(());
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).to_string()
    });
    let line = out.lines().find(|l| l.contains(" alive ")).unwrap_or_else(|| panic!("no alive node line:\n{out}"));
    let ops: f64 = line.split_whitespace().nth(3).and_then(|v| v.parse().ok()).unwrap();
    assert!(ops > 0.0, "the node's puts did not show: {line}");
    assert_eq!(run(&["top", &p, "--interval", "0"]).status.code(), Some(2));
    node.close().unwrap();
    drop(region);
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_dir_all(&local);
}

/// Every query of the Grafana dashboard names a metric the exporter serves
/// (with a node attached and an SSD tier running, so that every family is
/// there).
#[test]
fn the_dashboards_queries_name_served_metrics() {
    use cxlkv_platform::{FlushMode, Node, Options, Tier, TierOptions};
    use std::sync::Arc;
    let p = path("dash");
    let local = format!("{p}.local");
    let tier_dir = format!("/var/tmp/cxlkv-cli-dash-{}", std::process::id());
    std::fs::create_dir_all(&local).unwrap();
    assert!(run(&["format", &p, "--size", "32M", "--chunk", "64K", "--entries", "4096"]).status.success());
    let opts = || Options { mode: FlushMode::Coherent, local_dir: local.clone().into(), ..Options::default() };
    let node = Arc::new(Node::open(std::path::Path::new(&p), opts()).unwrap());
    let topts = TierOptions {
        dirs: vec![tier_dir.clone().into()],
        slot_bytes: 64 << 10,
        capacity: 4 << 20,
        ..TierOptions::default()
    };
    let tier = Tier::start(node.clone(), topts).unwrap();
    let text = String::from_utf8_lossy(&run(&["stats", &p, "--prometheus"]).stdout).to_string();
    let families: std::collections::HashSet<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    let dash: serde_json::Value =
        serde_json::from_str(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/grafana/cxlkv-region.json"))).unwrap();
    let mut exprs = Vec::new();
    fn walk<'a>(v: &'a serde_json::Value, out: &mut Vec<&'a str>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, x) in m {
                    match (k.as_str(), x) {
                        ("expr", serde_json::Value::String(e)) => out.push(e),
                        _ => walk(x, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    walk(&dash, &mut exprs);
    assert!(exprs.len() >= 13, "{} queries", exprs.len());
    let mut named = 0;
    for e in &exprs {
        for (i, _) in e.match_indices("cxlkv_") {
            let name: String = e[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            let family = name.strip_suffix("_total").unwrap_or(&name);
            assert!(families.contains(family), "the dashboard asks for {name}, which is not served:\n{text}");
            named += 1;
        }
    }
    assert!(named >= exprs.len());
    tier.stop().unwrap();
    drop(node);
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_dir_all(&local);
    let _ = std::fs::remove_dir_all(&tier_dir);
}

/// `demo --ssd DIR` leaves nothing behind: the slot file goes, and so does
/// the directory when the demo made it; a directory that existed stays.
/// Its report names the bytes the tier wrote per byte published.
#[test]
fn demo_ssd_reports_write_amplification_and_leaves_nothing_behind() {
    let base =
        std::env::var_os("CXLKV_TIER_TEST_DIR").map(std::path::PathBuf::from).unwrap_or_else(|| "/var/tmp".into());
    let made = base.join(format!("cxlkv-cli-demo-ssd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&made);
    let d = made.to_str().unwrap();
    let args = ["demo", "--duration", "1", "--block-size", "256K", "--region", "512M", "--ssd", d];
    let o = run(&args);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(out.contains("bytes written per byte published"), "{out}");
    assert!(!made.exists(), "the directory the demo made is gone");
    std::fs::create_dir(&made).unwrap();
    let o = run(&args);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let left: Vec<_> = std::fs::read_dir(&made).unwrap().collect();
    assert!(made.is_dir() && left.is_empty(), "a directory given stays, emptied of the slot file: {left:?}");
    std::fs::remove_dir(&made).unwrap();
}

/// Progress goes to stderr a line at a time when it is not a terminal (a
/// line every five seconds, no carriage returns), and `--quiet` prints
/// none; the summary is on stdout either way.
#[test]
fn demo_progress_is_lines_in_a_log_and_nothing_when_quiet() {
    let args = ["demo", "--duration", "6", "--block-size", "256K", "--region", "512M"];
    let o = run(&args);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert!(err.lines().any(|l| l.contains("requests") && l.contains("handed off")), "a progress line: {err}");
    assert!(!err.contains('\r'), "no carriage return in a log: {err:?}");
    let o = run(&[&args[..], &["--quiet"]].concat());
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    assert!(!err.contains("handed off"), "no progress with --quiet: {err}");
    assert!(out.contains("result             PASS"), "{out}");
}

/// `demo --rate R` starts requests on a fixed schedule: R a second, all
/// prefill workers together, never more (a run as fast as it goes makes
/// dozens a second with these blocks); a rate outside 0.1..=100000 is
/// refused before anything runs.
#[test]
fn demo_rate_starts_requests_on_a_schedule_and_never_ahead_of_it() {
    let args = ["demo", "--duration", "3", "--block-size", "256K", "--region", "512M", "--rate", "4", "--json"];
    let o = run(&args);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["config"]["rate"].as_f64(), Some(4.0), "{out}");
    let n = v["requests_handed_off"].as_u64().unwrap();
    // Due at k / 4 s for k = 0, 1, ...: those before 3 s.
    assert!((1..=12).contains(&n), "{n} requests at 4 a second over 3 s: {out}");
    assert!(v["requests_late"].as_u64().is_some(), "{out}");
    for bad in ["0", "-1", "nan", "1e9"] {
        let o = run(&["demo", "--duration", "1", &format!("--rate={bad}")]);
        assert!(!o.status.success(), "--rate {bad} refused");
        assert!(String::from_utf8_lossy(&o.stderr).contains("--rate"), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// `demo --tenants 3`: three tenants with their own rates, quotas and
/// shares; the run passes with every quota and share held through it, and
/// reports each tenant's part. A count outside 2..=7, or with `--rate`, is
/// refused before anything runs.
#[test]
fn demo_tenants_hold_their_quotas_and_shares_and_report_each_part() {
    let args = ["demo", "--duration", "4", "--block-size", "256K", "--region", "512M", "--tenants", "3", "--json"];
    let o = run(&args);
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["ok"], true, "{out}");
    assert_eq!(v["config"]["tenants"].as_u64(), Some(3), "{out}");
    let ts = v["tenants"].as_array().unwrap();
    let names: Vec<&str> = ts.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["busy", "quiet", "team-2"], "{out}");
    for t in ts {
        assert_eq!((t["quota_held"].as_bool(), t["share_held"].as_bool()), (Some(true), Some(true)), "{t}");
        assert!(t["samples"].as_u64().unwrap() > 0 && t["workers"].as_u64() == Some(1), "{t}");
        let quota = t["quota"].as_u64().unwrap();
        assert!(quota == 0 || t["bytes_max"].as_u64().unwrap() <= quota, "{t}");
    }
    assert!(ts[0]["quota"].as_u64().unwrap() > 0 && ts[1]["share"].as_u64().unwrap() > 0, "{out}");
    for bad in [&["--tenants", "1"][..], &["--tenants", "8"], &["--tenants", "2", "--rate", "3"]] {
        let mut a = vec!["demo", "--duration", "1"];
        a.extend_from_slice(bad);
        let o = run(&a);
        assert!(!o.status.success(), "{bad:?} refused");
        assert!(String::from_utf8_lossy(&o.stderr).contains("--tenants"), "{}", String::from_utf8_lossy(&o.stderr));
    }
}

/// `format` gives the file mode 0600, or 0660 with `--group`, whatever the
/// umask, and never reuses a file another user owns, `--force` or not.
#[test]
fn format_sets_the_file_mode_and_never_reuses_another_users_file() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let p = path("mode");
    let mode = || std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
    let fmt = |extra: &str| {
        let cmd = format!("umask 077; exec {BIN} format {p} --size 16M --chunk 64K --entries 1024 {extra}");
        Command::new("sh").args(["-c", &cmd]).output().unwrap()
    };
    assert!(fmt("").status.success());
    assert_eq!(mode(), 0o600);
    let o = fmt("--force --group");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(mode(), 0o660, "the group's bits, under a umask of 077");
    let ino = std::fs::metadata(&p).unwrap().ino();
    if std::os::unix::fs::chown(&p, Some(4242), None).is_err() {
        eprintln!("not root: another user's file is not checked here");
        let _ = std::fs::remove_file(&p);
        return;
    }
    let o = fmt("--force");
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("belongs to another user"), "{o:?}");
    assert_eq!(std::fs::metadata(&p).unwrap().ino(), ino, "the file is kept");
    assert_eq!(run(&["check", &p]).status.code(), Some(0), "and its region with it");
    let _ = std::fs::remove_file(&p);
}
