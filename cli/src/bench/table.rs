//! The bench's report as tables on a terminal.

use super::peers::{llc_bytes, GET_SIZES};
use super::report::{CrossProcess, GetReport, GetRow, LockPeer, ModeReport, PutReport, PutRow, Report};

/// Prints the report as tables.
pub fn print_table(r: &Report) {
    println!("flush cost per 64-byte line (4 KiB payload writes, each fenced; 8 MiB), against plain stores");
    println!("{:<32}{:>12}{:>12}", "primitive", "ns/line", "x plain");
    for row in &r.flush {
        println!("{:<32}{:>12.2}{:>12.1}", row.primitive, row.ns_per_line, row.x_plain);
    }
    println!();
    println!("payload checker of the demo and tests, 2 MiB blocks over 64 MiB, against memcpy");
    println!("{:<32}{:>12}{:>12}", "pass", "GB/s", "x memcpy");
    for row in &r.checker {
        println!("{:<32}{:>12.2}{:>12.2}", row.what, row.gb_per_s, row.x_memcpy);
    }
    println!();
    let modes = &r.modes;
    println!("per-block cost in one process, ns ({} blocks of {} bytes, /dev/shm)", r.blocks, r.block_bytes);
    header(modes, "operation");
    let nrows = modes.first().map_or(0, |m| m.rows.len());
    for i in 0..nrows {
        print!("{:<40}", modes[0].rows[i].op);
        for m in modes {
            print!("{:>12.0}", m.rows.get(i).map_or(f64::NAN, |x| x.ns_per_block));
        }
        println!();
    }
    println!();
    print_puts(modes);
    print_cross_process(modes);
}

/// The first column's title, then each mode's name.
fn header(modes: &[ModeReport], first: &str) {
    print!("{first:<40}");
    for m in modes {
        print!("{:>12}", m.mode);
    }
    println!();
}

/// Puts through `Node::put`, per size and mode.
fn print_puts(modes: &[ModeReport]) {
    let ws = modes.first().map_or(0, |m| m.cross_process.working_set_bytes);
    println!(
        "put through Node::put (as cxlkv_put and Python's Node.put; QD1, fresh keys over {} MiB; a full region: a \
         quarter as large, its puts evicting)",
        ws >> 20
    );
    header(modes, "measure");
    for (i, size) in GET_SIZES.iter().enumerate() {
        let kib = size >> 10;
        let put_row = |name: String, f: &dyn Fn(&PutReport) -> f64, prec: usize| {
            print!("{name:<40}");
            for m in modes {
                print!("{:>12.prec$}", m.put.get(i).map_or(f64::NAN, f));
            }
            println!();
        };
        for (how, pick) in [
            ("", (|p: &PutReport| &p.default_stores) as fn(&PutReport) -> &PutRow),
            (" plain+flush", |p| &p.plain_stores),
        ] {
            put_row(format!("put {kib} KiB{how} p50, us"), &|p| pick(p).p50_ns as f64 / 1e3, 1);
            put_row(format!("put {kib} KiB{how}, GB/s"), &|p| pick(p).gb_per_s, 2);
            put_row(format!("put {kib} KiB{how}, % of memcpy"), &|p| pick(p).pct_of_memcpy, 0);
        }
        let full = |p: &PutReport| -> f64 { p.full_region.gb_per_s };
        put_row(format!("put {kib} KiB, full region p50, us"), &|p| p.full_region.p50_ns as f64 / 1e3, 1);
        put_row(format!("put {kib} KiB, full region p99, us"), &|p| p.full_region.p99_ns as f64 / 1e3, 1);
        put_row(format!("put {kib} KiB, full region mean, us"), &|p| kib as f64 * 1.024 / full(p), 1);
        put_row(format!("put {kib} KiB, full region, GB/s"), &full, 2);
        put_row(format!("put {kib} KiB, full region, evictions a put"), &|p| p.full_evictions_per_put, 2);
        put_row(format!("memcpy {kib} KiB, GB/s (same run)"), &|p| p.memcpy.gb_per_s, 2);
    }
    println!();
}

/// Gets, handoffs, RPCs and locks between two processes, per mode.
fn print_cross_process(modes: &[ModeReport]) {
    let ws = modes.first().map_or(0, |m| m.cross_process.working_set_bytes);
    println!(
        "between two processes (QD1; gets through Node::get, as cxlkv_get; random keys over {} MiB, LLC {} MiB)",
        ws >> 20,
        llc_bytes() >> 20
    );
    header(modes, "measure");
    let row = |name: String, f: &dyn Fn(&CrossProcess) -> f64, prec: usize| {
        print!("{name:<40}");
        for m in modes {
            print!("{:>12.prec$}", f(&m.cross_process));
        }
        println!();
    };
    for (i, size) in GET_SIZES.iter().enumerate() {
        let kib = size >> 10;
        for (w, pass) in [("cold", (|g: &GetReport| &g.cold) as fn(&GetReport) -> &GetRow), ("warm", |g| &g.warm)] {
            let at = move |x: &CrossProcess, f: fn(&GetRow) -> f64| x.get.get(i).map_or(f64::NAN, |g| f(pass(g)));
            row(format!("get {kib} KiB {w} reader p50, us"), &|x| at(x, |r| r.p50_ns as f64) / 1e3, 1);
            row(format!("get {kib} KiB {w} reader p99, us"), &|x| at(x, |r| r.p99_ns as f64) / 1e3, 1);
            row(format!("get {kib} KiB {w} at p50, % of {w} memcpy"), &|x| at(x, |r| r.pct_of_memcpy), 0);
        }
        row(
            format!("memcpy {kib} KiB p50, us (same run)"),
            &|x| x.get.get(i).map_or(f64::NAN, |g| g.memcpy.p50_ns) / 1e3,
            1,
        );
        row(
            format!("memcpy {kib} KiB cold p50, us (same run)"),
            &|x| x.get.get(i).map_or(f64::NAN, |g| g.memcpy_cold.p50_ns) / 1e3,
            1,
        );
    }
    let us = |v: u64| v as f64 / 1e3;
    row("handoff (one way) p50, us".into(), &|x| us(x.handoff_ns.p50), 1);
    row("handoff (one way) p99, us".into(), &|x| us(x.handoff_ns.p99), 1);
    row("RPC round trip p50, us".into(), &|x| us(x.rpc_round_trip_ns.p50), 1);
    row("RPC round trip p99, us".into(), &|x| us(x.rpc_round_trip_ns.p99), 1);
    type Pick = fn(&CrossProcess) -> &LockPeer;
    let peers: [(&str, Pick); 2] = [
        ("other process than the manager", |x| &x.lock_other_process_uncontended),
        ("other process, each after 5 ms idle", |x| &x.lock_other_process_after_pause),
    ];
    for (what, pick) in peers {
        row(format!("lock+unlock, {what}, mean ns"), &|x| pick(x).ns_per_op, 0);
        row(format!("lock+unlock, {what}, p50 ns"), &|x| pick(x).p50_ns as f64, 0);
        row(format!("lock+unlock, {what}, p99 ns"), &|x| pick(x).p99_ns as f64, 0);
    }
    row("wake a sleeping thread of another process p50, us".into(), &|x| us(x.wake_reference_ns.p50), 1);
    row("lock+unlock, 2 processes contending, ns".into(), &|x| x.lock_contended.ns_per_op, 0);
}
