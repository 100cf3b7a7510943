//! `cargo xtask hub-serve`: a local Hub stand-in serving the fixture model and a GSM8K-format
//! dataset, to try hub downloads by hand (`HF_ENDPOINT=http://127.0.0.1:PORT atomrl-train …`).

use std::path::Path;

use anyhow::Result;
use atomrl_hub::test_server::HubServer;

#[derive(clap::Args)]
pub struct HubServeArgs {
    /// Port on 127.0.0.1.
    #[arg(long, default_value_t = 8765)]
    port: u16,
}

/// Serves `org/tiny` (one weights file), `org/tiny-sharded` (two shards and an index) and
/// `openai/gsm8k` (config `main`, 200 train and 50 test rows of sums) until killed.
pub fn run(a: &HubServeArgs) -> Result<std::convert::Infallible> {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/reference/models/tiny-qwen2");
    let server = HubServer::start_on(a.port)?;
    server.add_tiny_models(&model)?;
    let rows = |n: usize, offset: usize| -> Vec<(String, String)> {
        (offset..offset + n)
            .map(|i| {
                let (x, y) = (i % 13, i % 11);
                (
                    format!("Ann has {x} apples and buys {y} more. How many apples does she have?"),
                    format!("{x}+{y}=<<{x}+{y}={0}>>{0}\n#### {0}", x + y),
                )
            })
            .collect()
    };
    server.add_gsm8k("openai/gsm8k", &rows(200, 0), &rows(50, 200))?;
    println!("serving org/tiny, org/tiny-sharded and openai/gsm8k; use");
    println!("  export HF_ENDPOINT={}", server.url());
    println!("(Ctrl-C stops it)");
    loop {
        std::thread::park();
    }
}
