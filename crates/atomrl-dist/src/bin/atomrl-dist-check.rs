//! Checks atomrl-dist's MPI collectives; run it on every rank:
//!
//! ```text
//! mpirun -np 2 atomrl-dist-check                  # check every collective, one line per rank
//! mpirun -np 2 atomrl-dist-check --fail-rank 1    # rank 1 fails and aborts: the job exits non-zero
//! mpirun -np 2 atomrl-dist-check --bench          # time all_reduce_sum_f32 of 1.05 M and 4 M floats
//! atomrl-dist-check --bench-threads 2             # the same timings on a ThreadGroup of 2 (no MPI)
//! mpirun -np 2 atomrl-dist-check --nccl           # then the same checks through NCCL on cuda:local_rank
//! ```
//!
//! `--nccl` needs the `nccl` feature and one GPU per rank.
//!
//! Each rank's data is derived from its rank, so every rank can compute the expected results
//! (the rank-ordered sums of all ranks' data) by itself and compare them bit for bit.

use std::process::ExitCode;
use std::time::Instant;

use atomrl_dist::{
    sum_in_rank_order_f32, sum_in_rank_order_f64, Collective, MpiCollective, ThreadGroup,
};

/// Gradient sizes timed by `--bench`: the embedded example model's (~1.05 M parameters) and 4 M.
const BENCH_SIZES: [usize; 2] = [1_050_000, 4 * 1024 * 1024];
const BENCH_ITERS: usize = 20;

/// Rank `rank`'s data: values of mixed signs and magnitudes (so the summation order shows in
/// the low bits), from a SplitMix64 stream seeded by the rank.
fn data_f32(rank: usize, n: usize) -> Vec<f32> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ (rank as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (0..n)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let unit = (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5; // [-0.5, 0.5)
            let scale = [1e-3f32, 1.0, 1e3, 1e6][(z & 3) as usize];
            unit * scale
        })
        .collect()
}

fn data_f64(rank: usize, n: usize) -> Vec<f64> {
    data_f32(rank + 1000, n)
        .into_iter()
        .map(|x| f64::from(x) * 1.000_000_1)
        .collect()
}

fn bits32(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn bits64(v: &[f64]) -> Vec<u64> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn ensure(cond: bool, what: impl FnOnce() -> String) -> Result<(), String> {
    if cond {
        Ok(())
    } else {
        Err(what())
    }
}

/// Runs every collective on `comm` and compares with the values computed locally.
fn check(comm: &dyn Collective) -> Result<String, String> {
    let (rank, w) = (comm.rank(), comm.world_size());
    let e = |err: atomrl_dist::DistError| err.to_string();

    for n in [0usize, 1, 7, 1000, 100_003] {
        let mut buf = data_f32(rank, n);
        comm.all_reduce_sum_f32(&mut buf).map_err(e)?;
        let shards: Vec<Vec<f32>> = (0..w).map(|r| data_f32(r, n)).collect();
        let expected = sum_in_rank_order_f32(&shards);
        ensure(bits32(&buf) == bits32(&expected), || {
            format!("all_reduce_sum_f32 of {n}: not the rank-ordered sum")
        })?;

        let mut buf = data_f64(rank, n);
        comm.all_reduce_sum_f64(&mut buf).map_err(e)?;
        let shards: Vec<Vec<f64>> = (0..w).map(|r| data_f64(r, n)).collect();
        ensure(
            bits64(&buf) == bits64(&sum_in_rank_order_f64(&shards)),
            || format!("all_reduce_sum_f64 of {n}: not the rank-ordered sum"),
        )?;
    }

    for root in 0..w {
        let mut buf = data_f32(rank, 513);
        comm.broadcast_f32(&mut buf, root).map_err(e)?;
        ensure(bits32(&buf) == bits32(&data_f32(root, 513)), || {
            format!("broadcast_f32 from {root}: wrong data")
        })?;

        let message = |r: usize| {
            format!("bytes from rank {r};")
                .repeat(r * 1000 + 1)
                .into_bytes()
        };
        let mut bytes = if rank == root {
            message(root)
        } else {
            Vec::new()
        };
        comm.broadcast_bytes(&mut bytes, root).map_err(e)?;
        ensure(bytes == message(root), || {
            format!(
                "broadcast_bytes from {root}: {} bytes, wrong content",
                bytes.len()
            )
        })?;
    }

    let gathered = comm
        .all_gather_f64(&vec![rank as f64 + 0.5; rank + 1])
        .map_err(e)?;
    let expected: Vec<Vec<f64>> = (0..w).map(|r| vec![r as f64 + 0.5; r + 1]).collect();
    ensure(gathered == expected, || {
        format!("all_gather_f64: got {gathered:?}")
    })?;

    let records = comm
        .all_gather_bytes(format!("rank {rank}").repeat(rank).as_bytes())
        .map_err(e)?;
    let expected: Vec<Vec<u8>> = (0..w)
        .map(|r| format!("rank {r}").repeat(r).into_bytes())
        .collect();
    ensure(records == expected, || {
        format!("all_gather_bytes: got {} records", records.len())
    })?;

    comm.barrier().map_err(e)?;
    Ok("all_reduce_sum_f32/f64 (bit-exact rank order), broadcast_f32/bytes from every root, all_gather_f64/bytes, barrier: ok".into())
}

/// Times `all_reduce_sum_f32` of each of [`BENCH_SIZES`]; rank 0's lines.
fn bench(comm: &dyn Collective, label: &str) -> Result<Vec<String>, String> {
    bench_with(comm, label, |buf| {
        comm.all_reduce_sum_f32(buf).map_err(|e| e.to_string())
    })
}

/// For comparison: MPI's own `MPI_Allreduce(MPI_SUM)`, whose summation order is unspecified.
fn bench_native_mpi(comm: &MpiCollective) -> Result<Vec<String>, String> {
    use mpi::collective::{CommunicatorCollectives, SystemOperation};
    let world = mpi::topology::SimpleCommunicator::world();
    let mut out = Vec::new();
    bench_with(comm, "MPI_Allreduce (unordered, reference)", |buf| {
        out.clear();
        out.extend_from_slice(buf);
        world.all_reduce_into(&out[..], &mut buf[..], SystemOperation::sum());
        Ok(())
    })
}

fn bench_with(
    comm: &dyn Collective,
    label: &str,
    mut reduce: impl FnMut(&mut [f32]) -> Result<(), String>,
) -> Result<Vec<String>, String> {
    let mut lines = Vec::new();
    for n in BENCH_SIZES {
        let mut buf = data_f32(comm.rank(), n);
        let mut times = Vec::with_capacity(BENCH_ITERS);
        for i in 0..BENCH_ITERS + 2 {
            comm.barrier().map_err(|e| e.to_string())?;
            let start = Instant::now();
            reduce(&mut buf)?;
            if i >= 2 {
                times.push(start.elapsed().as_secs_f64() * 1e3);
            }
            // Keep magnitudes bounded over iterations.
            buf.iter_mut().for_each(|x| *x *= 0.5);
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let mean = times.iter().sum::<f64>() / times.len() as f64;
        lines.push(format!(
            "bench {label} W={} all_reduce_sum_f32 n={n} ({:.1} MB): median {median:.2} ms, mean {mean:.2} ms, min {:.2} ms over {BENCH_ITERS}",
            comm.world_size(),
            n as f64 * 4.0 / 1e6,
            times[0],
        ));
    }
    Ok(lines)
}

struct Args {
    fail_rank: Option<usize>,
    bench: bool,
    bench_threads: Option<usize>,
    #[cfg(feature = "nccl")]
    nccl: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        fail_rank: None,
        bench: false,
        bench_threads: None,
        #[cfg(feature = "nccl")]
        nccl: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut number = |name: &str| -> Result<usize, String> {
            it.next()
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| format!("{name} needs a non-negative integer"))
        };
        match a.as_str() {
            "--fail-rank" => args.fail_rank = Some(number("--fail-rank")?),
            "--bench" => args.bench = true,
            "--bench-threads" => args.bench_threads = Some(number("--bench-threads")?),
            #[cfg(feature = "nccl")]
            "--nccl" => args.nccl = true,
            #[cfg(not(feature = "nccl"))]
            "--nccl" => return Err("--nccl needs a build with the `nccl` feature".into()),
            other => {
                return Err(format!(
                    "unknown argument {other:?} (--fail-rank N, --bench, --bench-threads W, --nccl)"
                ))
            }
        }
    }
    Ok(args)
}

/// `--bench-threads W`: the bench on a ThreadGroup of `W` threads, no MPI.
fn bench_threads(w: usize) -> Result<(), String> {
    let members = ThreadGroup::new(w).map_err(|e| e.to_string())?;
    let results = std::thread::scope(|scope| {
        let handles: Vec<_> = members
            .into_iter()
            .map(|m| scope.spawn(move || bench(&m, "ThreadGroup")))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a member thread panicked".into()))
            })
            .collect::<Result<Vec<_>, String>>()
    })?;
    for line in results.into_iter().next().unwrap_or_default() {
        println!("{line}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("atomrl-dist-check: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(w) = args.bench_threads {
        return match bench_threads(w) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("atomrl-dist-check: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let mut comm = match MpiCollective::init() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("atomrl-dist-check: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (rank, w) = (comm.rank(), comm.world_size());
    let start = Instant::now();
    // Once with the default message size, once with every long buffer split into
    // 1000-element messages (the results must not change).
    let mut outcome = check(&comm);
    if outcome.is_ok() {
        let default = comm.max_message_elems();
        comm.set_max_message_elems(1000);
        outcome = check(&comm).map(|s| format!("{s} (also in 1000-element messages)"));
        comm.set_max_message_elems(default);
    }
    if outcome.is_ok() && args.fail_rank == Some(rank) {
        outcome = Err("failing on purpose (--fail-rank)".into());
    }
    if outcome.is_ok() {
        // Rank `fail_rank` aborts before this; the others would block here until MPI_Abort
        // ends the job.
        outcome = comm
            .barrier()
            .map(|()| String::new())
            .map_err(|e| e.to_string())
            .and(outcome);
    }
    match outcome {
        Ok(summary) => {
            println!(
                "rank {rank}/{w} (local {}): {summary} in {:.0} ms",
                comm.local_rank(),
                start.elapsed().as_secs_f64() * 1e3
            );
        }
        Err(e) => {
            eprintln!("rank {rank}/{w}: error: {e}; aborting the job");
            comm.abort(3);
        }
    }
    if args.bench {
        match bench(&comm, "MPI").and_then(|mut l| {
            l.extend(bench_native_mpi(&comm)?);
            Ok(l)
        }) {
            Ok(lines) if rank == 0 => lines.iter().for_each(|l| println!("{l}")),
            Ok(_) => {}
            Err(e) => {
                eprintln!("rank {rank}/{w}: bench error: {e}; aborting the job");
                comm.abort(3);
            }
        }
    }
    #[cfg(feature = "nccl")]
    if args.nccl {
        return nccl_check(comm, args.bench);
    }
    ExitCode::SUCCESS
}

/// `--nccl`: the checks (and `--bench`) again through an `NcclCollective` on `cuda:local_rank`.
#[cfg(feature = "nccl")]
fn nccl_check(mpi: MpiCollective, bench_too: bool) -> ExitCode {
    let (rank, w, gpu) = (mpi.rank(), mpi.world_size(), mpi.local_rank());
    let mut comm = match atomrl_dist::NcclCollective::new(mpi, gpu) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rank {rank}/{w}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let start = Instant::now();
    let mut outcome = check(&comm);
    if outcome.is_ok() {
        let default = comm.max_message_elems();
        comm.set_max_message_elems(1000);
        outcome = check(&comm).map(|s| format!("{s} (also in 1000-element messages)"));
        comm.set_max_message_elems(default);
    }
    match outcome {
        Ok(summary) => println!(
            "rank {rank}/{w} NCCL on cuda:{gpu}: {summary} in {:.0} ms",
            start.elapsed().as_secs_f64() * 1e3
        ),
        Err(e) => {
            eprintln!("rank {rank}/{w} NCCL: error: {e}; aborting the job");
            comm.abort(3);
        }
    }
    if bench_too {
        match bench(&comm, "NCCL") {
            Ok(lines) if rank == 0 => lines.iter().for_each(|l| println!("{l}")),
            Ok(_) => {}
            Err(e) => {
                eprintln!("rank {rank}/{w} NCCL: bench error: {e}; aborting the job");
                comm.abort(3);
            }
        }
    }
    ExitCode::SUCCESS
}
