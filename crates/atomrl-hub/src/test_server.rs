//! A Hugging Face Hub stand-in on 127.0.0.1 for tests: the file protocol `hf-hub` and
//! `huggingface_hub` speak, served from memory.
//!
//! - `GET /api/{models,datasets}/{id}/revision/{rev}`: `{"id", "sha", "siblings": [{"rfilename"}]}`;
//! - `GET|HEAD /{id}/resolve/{rev}/{path}` and `/datasets/{id}/resolve/{rev}/{path}`, with
//!   `Range: bytes=a-b` answered by 206 and `Content-Range`, and the `X-Repo-Commit` and `ETag`
//!   headers;
//! - 404 with `X-Error-Code` `RepoNotFound`, `RevisionNotFound` or `EntryNotFound`; 401/403
//!   with `GatedRepo` for a repository that requires a token.
//!
//! Faults for the interrupted-download tests: [`HubServer::cut_downloads`] sends half of a
//! file and closes the connection, [`HubServer::stall_downloads`] sends half and then nothing.
//!
//! Hand-rolled on `std::net` rather than built on an HTTP server crate because those tests need
//! to break a response in the middle of its body, which such crates are designed to prevent.
//! One connection per request (`Connection: close`), one thread per connection.
//!
//! ```
//! use atomrl_hub::{test_server::HubServer, RepoKind};
//! let server = HubServer::start().unwrap();
//! let sha = server.add_repo(RepoKind::Model, "org/tiny", "main",
//!     vec![("config.json".into(), b"{}".to_vec())]);
//! assert_eq!(sha.len(), 40);
//! assert!(server.url().starts_with("http://127.0.0.1:"));
//! ```

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::RepoKind;

/// One repository: its revisions (name → commit) and commits (commit → files).
#[derive(Default)]
struct Repo {
    refs: HashMap<String, String>,
    commits: HashMap<String, BTreeMap<String, Vec<u8>>>,
    token: Option<String>,
}

/// A fault injected into the downloads of files whose path ends with `suffix`.
struct Fault {
    suffix: String,
    remaining: usize,
    stall: bool,
}

#[derive(Default)]
struct State {
    repos: HashMap<(RepoKind, String), Repo>,
    faults: Vec<Fault>,
    log: Vec<String>,
}

/// The server; it stops when dropped.
pub struct HubServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl HubServer {
    /// Starts a server on a free port of 127.0.0.1.
    ///
    /// # Errors
    /// When no port can be bound.
    pub fn start() -> std::io::Result<Self> {
        Self::start_on(0)
    }

    /// Starts a server on `port` of 127.0.0.1 (0: a free one).
    ///
    /// # Errors
    /// When the port cannot be bound.
    pub fn start_on(port: u16) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port))?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp) = (Arc::clone(&state), Arc::clone(&stop));
        let accept = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if sp.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (st, sp) = (Arc::clone(&st), Arc::clone(&sp));
                std::thread::spawn(move || {
                    // A client that hangs up mid-request is not the server's problem.
                    let _ = serve(stream, &st, &sp);
                });
            }
        });
        Ok(Self {
            addr,
            state,
            stop,
            accept: Some(accept),
        })
    }

    /// `http://127.0.0.1:PORT`, the value for `HF_ENDPOINT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Adds (or replaces) revision `revision` of repository `id` with `files` (path, bytes);
    /// returns its commit hash (40 hex digits, derived from the contents).
    pub fn add_repo(
        &self,
        kind: RepoKind,
        id: &str,
        revision: &str,
        files: Vec<(String, Vec<u8>)>,
    ) -> String {
        let files: BTreeMap<String, Vec<u8>> = files.into_iter().collect();
        let mut h = Vec::new();
        h.extend_from_slice(id.as_bytes());
        h.extend_from_slice(revision.as_bytes());
        for (name, bytes) in &files {
            h.extend_from_slice(name.as_bytes());
            h.extend_from_slice(&hex_digest(bytes, 2).into_bytes());
        }
        let sha = hex_digest(&h, 3)[..40].to_string();
        let mut state = lock(&self.state);
        let repo = state.repos.entry((kind, id.to_string())).or_default();
        repo.refs.insert(revision.to_string(), sha.clone());
        repo.commits.insert(sha.clone(), files);
        sha
    }

    /// [`HubServer::add_repo`] with every file under `dir` (paths relative to it).
    ///
    /// # Errors
    /// When a file cannot be read.
    pub fn add_folder(
        &self,
        kind: RepoKind,
        id: &str,
        revision: &str,
        dir: &Path,
    ) -> std::io::Result<String> {
        let names =
            atomrl_core::hub::list_files(dir).map_err(|e| std::io::Error::other(e.to_string()))?;
        let mut files = Vec::new();
        for name in names {
            files.push((name.clone(), std::fs::read(dir.join(&name))?));
        }
        Ok(self.add_repo(kind, id, revision, files))
    }

    /// Serves the model folder `dir` twice, main branch: as `org/tiny` (its files as they are)
    /// and as `org/tiny-sharded` (its weights in two shards with an index, as
    /// [`sharded_model_files`] writes them) — the models of the download tests and of `cargo
    /// xtask hub-serve`.
    ///
    /// # Errors
    /// When the folder cannot be read or its weights are not safetensors.
    pub fn add_tiny_models(&self, dir: &Path) -> std::io::Result<()> {
        self.add_folder(RepoKind::Model, "org/tiny", "main", dir)?;
        self.add_repo(
            RepoKind::Model,
            "org/tiny-sharded",
            "main",
            sharded_model_files(dir, 2)?,
        );
        Ok(())
    }

    /// Serves dataset `id` (main branch) in GSM8K's layout: config `main`, one parquet file for
    /// each split (`main/train-00000-of-00001.parquet`, `main/test-…`), with `(question,
    /// answer)` rows.
    ///
    /// # Errors
    /// When the parquet writer fails.
    pub fn add_gsm8k(
        &self,
        id: &str,
        train: &[(String, String)],
        test: &[(String, String)],
    ) -> std::io::Result<()> {
        self.add_repo(
            RepoKind::Dataset,
            id,
            "main",
            vec![
                (
                    "main/train-00000-of-00001.parquet".into(),
                    gsm8k_parquet(train)?,
                ),
                (
                    "main/test-00000-of-00001.parquet".into(),
                    gsm8k_parquet(test)?,
                ),
            ],
        );
        Ok(())
    }

    /// Makes repository `id` answer 401 without a token and 403 with another one (`GatedRepo`).
    pub fn require_token(&self, kind: RepoKind, id: &str, token: &str) {
        let mut state = lock(&self.state);
        if let Some(repo) = state.repos.get_mut(&(kind, id.to_string())) {
            repo.token = Some(token.to_string());
        }
    }

    /// The next `times` downloads of a file whose path ends with `suffix` send half of the
    /// requested bytes and close the connection (the 1-byte metadata probes are not counted).
    pub fn cut_downloads(&self, suffix: &str, times: usize) {
        self.add_fault(suffix, times, false);
    }

    /// Downloads of a file whose path ends with `suffix` send half of the requested bytes and
    /// then hang until the server stops (to kill a client in the middle of a file).
    pub fn stall_downloads(&self, suffix: &str) {
        self.add_fault(suffix, usize::MAX, true);
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        lock(&self.state).faults.clear();
    }

    fn add_fault(&self, suffix: &str, times: usize, stall: bool) {
        lock(&self.state).faults.push(Fault {
            suffix: suffix.to_string(),
            remaining: times,
            stall,
        });
    }

    /// The requests served so far: `METHOD PATH [RANGE]`.
    pub fn requests(&self) -> Vec<String> {
        lock(&self.state).log.clone()
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the blocking `accept` so that its thread sees the flag.
        let _ = TcpStream::connect(self.addr);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// A request's method, decoded path and headers (lower-case names).
struct Request {
    method: String,
    path: String,
    headers: HashMap<String, String>,
}

fn read_request(stream: &TcpStream) -> std::io::Result<Request> {
    let mut reader = BufReader::new(stream.take(64 * 1024));
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or_default().to_string();
    let target = parts.next().unwrap_or_default();
    let path = percent_decode(target.split('?').next().unwrap_or_default());
    let mut headers = HashMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    Ok(Request {
        method,
        path,
        headers,
    })
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A response to write: status, extra headers, body, and how to break it.
struct Response {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
    fault: Option<bool>,
}

impl Response {
    fn error(status: u16, code: &str, message: &str) -> Self {
        Self {
            status,
            headers: vec![
                ("X-Error-Code", code.to_string()),
                ("Content-Type", "application/json".into()),
            ],
            body: serde_json::json!({ "error": message })
                .to_string()
                .into_bytes(),
            fault: None,
        }
    }
}

fn serve(mut stream: TcpStream, state: &Mutex<State>, stop: &AtomicBool) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let req = read_request(&stream)?;
    let range = req.headers.get("range").cloned();
    {
        let mut s = lock(state);
        let entry = match &range {
            Some(r) => format!("{} {} {r}", req.method, req.path),
            None => format!("{} {}", req.method, req.path),
        };
        s.log.push(entry);
    }
    let response = route(&req, range.as_deref(), state);
    write_response(&mut stream, &req.method, response, stop)
}

fn route(req: &Request, range: Option<&str>, state: &Mutex<State>) -> Response {
    let auth = req
        .headers
        .get("authorization")
        .and_then(|a| a.strip_prefix("Bearer "))
        .map(str::to_string);
    if let Some(rest) = req.path.strip_prefix("/api/") {
        let (kind, rest) = match rest.split_once('/') {
            Some(("models", r)) => (RepoKind::Model, r),
            Some(("datasets", r)) => (RepoKind::Dataset, r),
            _ => return Response::error(404, "EntryNotFound", "unknown API"),
        };
        let (id, rev) = match rest.rsplit_once("/revision/") {
            Some((id, rev)) => (id, rev),
            None => (rest, "main"),
        };
        return info(state, kind, id, rev, auth.as_deref());
    }
    let (kind, rest) = match req.path.strip_prefix("/datasets/") {
        Some(r) => (RepoKind::Dataset, r),
        None => (RepoKind::Model, req.path.trim_start_matches('/')),
    };
    let Some((id, rev_path)) = rest.split_once("/resolve/") else {
        return Response::error(404, "EntryNotFound", "unknown path");
    };
    let (rev, file) = rev_path.split_once('/').unwrap_or((rev_path, ""));
    resolve(state, kind, id, rev, file, range, auth.as_deref())
}

/// The repository's commit for `rev` (a revision name or a commit), or the error response.
fn commit<'a>(
    repo: Option<&'a Repo>,
    rev: &str,
    auth: Option<&str>,
) -> Result<(&'a String, &'a BTreeMap<String, Vec<u8>>), Response> {
    let repo = repo.ok_or_else(|| Response::error(404, "RepoNotFound", "Repository not found"))?;
    match (&repo.token, auth) {
        (Some(_), None) => return Err(Response::error(401, "GatedRepo", "Access restricted")),
        (Some(t), Some(a)) if t != a => {
            return Err(Response::error(403, "GatedRepo", "Access refused"))
        }
        _ => {}
    }
    let sha = repo
        .refs
        .get(rev)
        .or_else(|| repo.commits.keys().find(|k| k.as_str() == rev))
        .ok_or_else(|| Response::error(404, "RevisionNotFound", "Invalid rev id"))?;
    let files = repo
        .commits
        .get(sha)
        .ok_or_else(|| Response::error(404, "RevisionNotFound", "Invalid rev id"))?;
    Ok((sha, files))
}

fn info(state: &Mutex<State>, kind: RepoKind, id: &str, rev: &str, auth: Option<&str>) -> Response {
    let s = lock(state);
    match commit(s.repos.get(&(kind, id.to_string())), rev, auth) {
        Err(e) => e,
        Ok((sha, files)) => {
            let siblings: Vec<serde_json::Value> = files
                .keys()
                .map(|f| serde_json::json!({ "rfilename": f }))
                .collect();
            Response {
                status: 200,
                headers: vec![("Content-Type", "application/json".into())],
                body: serde_json::json!({ "id": id, "sha": sha, "siblings": siblings })
                    .to_string()
                    .into_bytes(),
                fault: None,
            }
        }
    }
}

fn resolve(
    state: &Mutex<State>,
    kind: RepoKind,
    id: &str,
    rev: &str,
    file: &str,
    range: Option<&str>,
    auth: Option<&str>,
) -> Response {
    let mut s = lock(state);
    let (sha, bytes) = match commit(s.repos.get(&(kind, id.to_string())), rev, auth) {
        Err(e) => return e,
        Ok((sha, files)) => match files.get(file) {
            Some(b) => (sha.clone(), b.clone()),
            None => return Response::error(404, "EntryNotFound", "Entry not found"),
        },
    };
    let total = bytes.len();
    let (start, end) = match range.map(|r| parse_range(r, total)) {
        None => (0, total),
        Some(Some(r)) => r,
        Some(None) => {
            let mut r = Response::error(416, "RangeNotSatisfiable", "bad range");
            r.headers
                .push(("Content-Range", format!("bytes */{total}")));
            return r;
        }
    };
    let mut fault = None;
    if end - start > 1 {
        if let Some(f) = s
            .faults
            .iter_mut()
            .find(|f| f.remaining > 0 && file.ends_with(&f.suffix))
        {
            f.remaining -= 1;
            fault = Some(f.stall);
        }
    }
    let mut headers = vec![
        ("X-Repo-Commit", sha),
        ("ETag", format!("\"{}\"", hex_digest(&bytes, 4))),
        ("Accept-Ranges", "bytes".into()),
    ];
    let status = if range.is_some() {
        headers.push((
            "Content-Range",
            format!("bytes {start}-{}/{total}", end.saturating_sub(1)),
        ));
        206
    } else {
        200
    };
    Response {
        status,
        headers,
        body: bytes[start..end].to_vec(),
        fault,
    }
}

/// `bytes=a-b` / `bytes=a-` as a half-open range within `total`; `None` when unsatisfiable.
fn parse_range(r: &str, total: usize) -> Option<(usize, usize)> {
    let spec = r.trim().strip_prefix("bytes=")?;
    let (a, b) = spec.split_once('-')?;
    let start: usize = a.trim().parse().ok()?;
    let end = match b.trim() {
        "" => total,
        b => b.parse::<usize>().ok()?.saturating_add(1).min(total),
    };
    (start < end || (start == 0 && total == 0)).then_some((start, end))
}

fn write_response(
    stream: &mut TcpStream,
    method: &str,
    r: Response,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let reason = match r.status {
        200 => "OK",
        206 => "Partial Content",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Error",
    };
    let mut head = format!("HTTP/1.1 {} {reason}\r\n", r.status);
    for (k, v) in &r.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        r.body.len()
    ));
    stream.write_all(head.as_bytes())?;
    if method == "HEAD" {
        return stream.flush();
    }
    match r.fault {
        None => stream.write_all(&r.body)?,
        Some(stall) => {
            stream.write_all(&r.body[..r.body.len() / 2])?;
            stream.flush()?;
            while stall && !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = stream.shutdown(std::net::Shutdown::Both);
            return Ok(());
        }
    }
    stream.flush()
}

/// Hex digits of a non-cryptographic digest of `bytes` (`words` × 16 digits): unique enough
/// for a test server's commit ids and ETags, without a hashing dependency.
fn hex_digest(bytes: &[u8], words: usize) -> String {
    (0..words as u64)
        .map(|seed| {
            // FNV-1a, seeded per word.
            let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            format!("{h:016x}")
        })
        .collect()
}

/// The files of a model folder with its `model.safetensors` split into `shards` shards and a
/// `model.safetensors.index.json` (as `save_pretrained` with a size limit writes them).
///
/// # Errors
/// When the folder cannot be read or its weights are not safetensors.
pub fn sharded_model_files(dir: &Path, shards: usize) -> std::io::Result<Vec<(String, Vec<u8>)>> {
    use safetensors::SafeTensors;
    let err = |e: safetensors::SafeTensorError| std::io::Error::other(e.to_string());
    let mut out = Vec::new();
    for name in
        atomrl_core::hub::list_files(dir).map_err(|e| std::io::Error::other(e.to_string()))?
    {
        if name != "model.safetensors" {
            out.push((name.clone(), std::fs::read(dir.join(&name))?));
        }
    }
    let bytes = std::fs::read(dir.join("model.safetensors"))?;
    let tensors = SafeTensors::deserialize(&bytes).map_err(err)?;
    let mut names: Vec<String> = tensors.names().into_iter().map(str::to_string).collect();
    names.sort();
    let shards = shards.clamp(1, names.len().max(1));
    let per = names.len().div_ceil(shards);
    let mut weight_map = serde_json::Map::new();
    for (i, group) in names.chunks(per.max(1)).enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, shards);
        let mut views = Vec::new();
        for n in group {
            views.push((n.clone(), tensors.tensor(n).map_err(err)?));
            weight_map.insert(n.clone(), serde_json::Value::String(file.clone()));
        }
        out.push((file, safetensors::serialize(views, None).map_err(err)?));
    }
    let index =
        serde_json::json!({ "metadata": { "total_size": bytes.len() }, "weight_map": weight_map });
    out.push((
        "model.safetensors.index.json".into(),
        index.to_string().into_bytes(),
    ));
    Ok(out)
}

/// A GSM8K-format parquet file (`question`, `answer` columns, snappy-compressed like the
/// hub's) holding `rows`.
///
/// # Errors
/// When the parquet writer fails.
pub fn gsm8k_parquet(rows: &[(String, String)]) -> std::io::Result<Vec<u8>> {
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    let err = |e: parquet::errors::ParquetError| std::io::Error::other(e.to_string());
    let schema = parquet::schema::parser::parse_message_type(
        "message schema { REQUIRED BYTE_ARRAY question (UTF8); REQUIRED BYTE_ARRAY answer (UTF8); }",
    )
    .map_err(err)?;
    let props = WriterProperties::builder()
        .set_compression(parquet::basic::Compression::SNAPPY)
        .build();
    let mut buf = Vec::new();
    let mut writer =
        SerializedFileWriter::new(&mut buf, Arc::new(schema), Arc::new(props)).map_err(err)?;
    let mut group = writer.next_row_group().map_err(err)?;
    let mut column = 0;
    while let Some(mut w) = group.next_column().map_err(err)? {
        let values: Vec<ByteArray> = rows
            .iter()
            .map(|(q, a)| ByteArray::from(if column == 0 { q.as_str() } else { a.as_str() }))
            .collect();
        w.typed::<ByteArrayType>()
            .write_batch(&values, None, None)
            .map_err(err)?;
        w.close().map_err(err)?;
        column += 1;
    }
    group.close().map_err(err)?;
    writer.close().map_err(err)?;
    Ok(buf)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        assert_eq!(parse_range("bytes=0-0", 10), Some((0, 1)));
        assert_eq!(parse_range("bytes=4-", 10), Some((4, 10)));
        assert_eq!(parse_range("bytes=4-100", 10), Some((4, 10)));
        assert_eq!(parse_range("bytes=10-", 10), None);
        assert_eq!(percent_decode("a%2Fb"), "a/b");
        assert_eq!(percent_decode("100%"), "100%");
    }
}
