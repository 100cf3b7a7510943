//! TensorBoard event files written by `TensorBoardWriter`, parsed back with a minimal TFRecord
//! and protobuf decoder written here from the format's specification.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use atomrl_metrics::{MetricRow, TensorBoardWriter};

fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("logging-tb-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// The TFRecord mask, spelled as in the format's documentation (independent of the crate's).
#[allow(clippy::manual_rotate)]
fn masked_crc(data: &[u8]) -> u32 {
    let crc = crc32c::crc32c(data);
    ((crc >> 15) | (crc << 17)).wrapping_add(0xa282_ead8)
}

/// Splits a TFRecord file into records, checking both CRCs of each.
fn records(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len_bytes = &bytes[at..at + 8];
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let len_crc = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap());
        assert_eq!(
            len_crc,
            masked_crc(len_bytes),
            "length CRC of record at {at}"
        );
        let data = &bytes[at + 12..at + 12 + len];
        let data_crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
        assert_eq!(data_crc, masked_crc(data), "data CRC of record at {at}");
        out.push(data.to_vec());
        at += 16 + len;
    }
    assert_eq!(at, bytes.len(), "trailing bytes");
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Field {
    Varint(u64),
    Fixed64([u8; 8]),
    Bytes(Vec<u8>),
    Fixed32([u8; 4]),
}

fn varint(buf: &[u8], at: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = buf[*at];
        *at += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// Decodes one protobuf message into `(field number, value)` pairs.
fn fields(buf: &[u8]) -> Vec<(u64, Field)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let key = varint(buf, &mut at);
        let field = match key & 7 {
            0 => Field::Varint(varint(buf, &mut at)),
            1 => {
                at += 8;
                Field::Fixed64(buf[at - 8..at].try_into().unwrap())
            }
            2 => {
                let len = varint(buf, &mut at) as usize;
                at += len;
                Field::Bytes(buf[at - len..at].to_vec())
            }
            5 => {
                at += 4;
                Field::Fixed32(buf[at - 4..at].try_into().unwrap())
            }
            w => panic!("unexpected wire type {w}"),
        };
        out.push((key >> 3, field));
    }
    out
}

fn get(msg: &[(u64, Field)], number: u64) -> Option<&Field> {
    msg.iter().find(|(n, _)| *n == number).map(|(_, f)| f)
}

fn bytes(f: Option<&Field>) -> Vec<u8> {
    match f {
        Some(Field::Bytes(b)) => b.clone(),
        other => panic!("expected bytes, got {other:?}"),
    }
}

/// A decoded `Event`.
#[derive(Debug)]
struct Event {
    wall_time: f64,
    step: u64,
    file_version: Option<String>,
    /// `(tag, simple_value)` of scalar values.
    scalars: Vec<(String, f32)>,
    /// `(tag, plugin_name, dtype, string_val)` of tensor values.
    tensors: Vec<(String, String, u64, Vec<u8>)>,
    session_status: Option<u64>,
}

fn decode_event(data: &[u8]) -> Event {
    let msg = fields(data);
    let wall_time = match get(&msg, 1) {
        Some(Field::Fixed64(b)) => f64::from_le_bytes(*b),
        other => panic!("wall_time: {other:?}"),
    };
    let step = match get(&msg, 2) {
        Some(Field::Varint(v)) => *v,
        None => 0,
        other => panic!("step: {other:?}"),
    };
    let file_version = get(&msg, 3).map(|f| String::from_utf8(bytes(Some(f))).unwrap());
    let mut scalars = Vec::new();
    let mut tensors = Vec::new();
    if let Some(summary) = get(&msg, 5) {
        for (n, value) in fields(&bytes(Some(summary))) {
            assert_eq!(n, 1, "Summary has only `value` (1)");
            let value = fields(&bytes(Some(&value)));
            let tag = String::from_utf8(bytes(get(&value, 1))).unwrap();
            if let Some(Field::Fixed32(b)) = get(&value, 2) {
                scalars.push((tag, f32::from_le_bytes(*b)));
            } else {
                let metadata = fields(&bytes(get(&value, 9)));
                let plugin = fields(&bytes(get(&metadata, 1)));
                let plugin_name = String::from_utf8(bytes(get(&plugin, 1))).unwrap();
                let tensor = fields(&bytes(get(&value, 8)));
                let Some(Field::Varint(dtype)) = get(&tensor, 1) else {
                    panic!("dtype")
                };
                assert_eq!(bytes(get(&tensor, 2)), b"", "scalar shape");
                tensors.push((tag, plugin_name, *dtype, bytes(get(&tensor, 8))));
            }
        }
    }
    let session_status = get(&msg, 7).map(|f| {
        let log = fields(&bytes(Some(f)));
        match get(&log, 1) {
            Some(Field::Varint(v)) => *v,
            other => panic!("status: {other:?}"),
        }
    });
    Event {
        wall_time,
        step,
        file_version,
        scalars,
        tensors,
        session_status,
    }
}

fn read_events(path: &Path) -> Vec<Event> {
    records(&std::fs::read(path).unwrap())
        .iter()
        .map(|r| decode_event(r))
        .collect()
}

#[test]
fn scalars_text_and_session_start_round_trip() {
    let dir = temp_dir("roundtrip");
    let mut tb = TensorBoardWriter::create(&dir).unwrap();
    for step in 1..=3u64 {
        let row = MetricRow::new(step)
            .with("reward/mean", 0.25 * step as f64)
            .with("loss", if step == 2 { f64::NAN } else { -1.5 })
            .with("lr", 1e-6);
        tb.add_scalars(&row).unwrap();
    }
    tb.add_scalars(&MetricRow::new(4).with("loss", f64::INFINITY))
        .unwrap(); // nothing finite: no event
    tb.add_text(3, "samples", "**prompt** héllo\n\n`4`")
        .unwrap();
    tb.add_session_start(4).unwrap();
    tb.flush().unwrap();

    let name = tb.path().file_name().unwrap().to_str().unwrap().to_string();
    let parts: Vec<&str> = name.split('.').collect();
    assert_eq!(&parts[..3], ["events", "out", "tfevents"]);
    assert!(parts[3].parse::<u64>().unwrap() > 1_600_000_000, "{name}");
    assert_eq!(parts[parts.len() - 2], std::process::id().to_string());
    assert_eq!(parts[parts.len() - 1], "atomrl");

    let events = read_events(tb.path());
    assert_eq!(events.len(), 1 + 3 + 1 + 1);
    assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
    assert_eq!(events[0].step, 0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for e in &events {
        assert!((now - e.wall_time).abs() < 600.0, "{e:?}");
    }

    let steps: Vec<u64> = events[1..4].iter().map(|e| e.step).collect();
    assert_eq!(steps, [1, 2, 3]);
    assert_eq!(
        events[1].scalars,
        [
            ("reward/mean".to_string(), 0.25),
            ("loss".to_string(), -1.5),
            ("lr".to_string(), 1e-6)
        ]
    );
    // The NaN loss of step 2 is left out.
    assert_eq!(
        events[2].scalars,
        [("reward/mean".to_string(), 0.5), ("lr".to_string(), 1e-6)]
    );

    let text = &events[4];
    assert_eq!(text.step, 3);
    assert!(text.scalars.is_empty());
    assert_eq!(
        text.tensors,
        [(
            "samples".to_string(),
            "text".to_string(),
            7,
            "**prompt** héllo\n\n`4`".as_bytes().to_vec()
        )]
    );

    assert_eq!(events[5].step, 4);
    assert_eq!(events[5].session_status, Some(1));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_writers_in_one_folder_get_distinct_files() {
    let dir = temp_dir("two");
    let a = TensorBoardWriter::create(&dir).unwrap();
    let b = TensorBoardWriter::create(&dir).unwrap();
    assert_ne!(a.path(), b.path());
    // TensorBoard reads files in name order: the later writer's file sorts last.
    assert!(b.path() > a.path(), "{:?} {:?}", a.path(), b.path());
    assert!(b.path().to_str().unwrap().ends_with(".atomrl"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 2);
    // Each holds just the file_version event.
    assert_eq!(read_events(a.path()).len(), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_new_file_sorts_after_files_from_the_future() {
    let dir = temp_dir("future");
    std::fs::create_dir_all(&dir).unwrap();
    let future = dir.join("events.out.tfevents.1999999999.other.1.atomrl");
    std::fs::write(&future, b"").unwrap();
    std::fs::write(dir.join("events.out.tfevents.x.y"), b"").unwrap(); // ignored
    let tb = TensorBoardWriter::create(&dir).unwrap();
    let name = tb.path().file_name().unwrap().to_str().unwrap();
    assert!(
        name.starts_with("events.out.tfevents.2000000000."),
        "{name}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn large_steps_and_long_tags_use_multi_byte_varints() {
    let dir = temp_dir("varint");
    let mut tb = TensorBoardWriter::create(&dir).unwrap();
    let tag = "x".repeat(300);
    tb.add_scalars(&MetricRow::new(1 << 40).with(tag.clone(), 3.5))
        .unwrap();
    let events = read_events(tb.path());
    assert_eq!(events[1].step, 1 << 40);
    assert_eq!(events[1].scalars, [(tag, 3.5)]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn unwritable_folder_is_a_file_error() {
    let dir = temp_dir("blocked");
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    std::fs::write(&dir, b"a file, not a folder").unwrap();
    let err = TensorBoardWriter::create(&dir).unwrap_err().to_string();
    assert!(err.starts_with(&dir.display().to_string()), "{err}");
    std::fs::remove_file(&dir).unwrap();
}
