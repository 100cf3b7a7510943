//! The dashboard end to end in headless Chromium (Debian's `chromium`, which `.ci/run`
//! installs): the runs list, a run's charts drawn, the rollout browser filtered, two runs
//! compared, and a chart that updates when the run appends a metrics line. It also takes the
//! README's screenshots (`ATOMRL_UPDATE_SCREENSHOTS=1` writes them to docs/images/).
//!
//! Without a Chromium the test says so and passes, unless `ATOMRL_REQUIRE_BROWSER=1` (set by
//! `.ci/run`) makes that a failure.

#![allow(clippy::unwrap_used)]

mod common;

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use headless_chrome::protocol::cdp::Page::CaptureScreenshotFormatOption;
use headless_chrome::{Browser, LaunchOptions, Tab};

/// Debian's Chromium, or `$CHROME`.
fn chromium() -> Option<PathBuf> {
    std::env::var_os("CHROME")
        .map(PathBuf::from)
        .into_iter()
        .chain(
            [
                "/usr/bin/chromium",
                "/usr/bin/chromium-browser",
                "/usr/bin/google-chrome",
            ]
            .map(PathBuf::from),
        )
        .find(|p| p.is_file())
}

/// Evaluates `js` in the page; its JSON value.
fn eval(tab: &Tab, js: &str) -> serde_json::Value {
    tab.evaluate(js, false)
        .unwrap_or_else(|e| panic!("{js}: {e}"))
        .value
        .unwrap_or(serde_json::Value::Null)
}

/// Waits until `js` evaluates to `true` (20 s at most).
fn wait_true(tab: &Tab, js: &str, what: &str) {
    let start = Instant::now();
    while eval(tab, js) != serde_json::Value::Bool(true) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}; messages: {}",
            eval(tab, "document.querySelector('#messages')?.innerText ?? ''")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sets a form control's value and fires the events a user's edit fires.
fn set_control(tab: &Tab, selector: &str, value: &str) {
    let js = format!(
        "(() => {{ const e = document.querySelector({sel}); e.value = {val}; \
         e.dispatchEvent(new Event('input', {{bubbles: true}})); \
         e.dispatchEvent(new Event('change', {{bubbles: true}})); return true; }})()",
        sel = serde_json::json!(selector),
        val = serde_json::json!(value)
    );
    assert_eq!(eval(tab, &js), serde_json::Value::Bool(true));
}

/// Goes to hash route `route` of the loaded page, as a link in the page does (no reload).
fn route(tab: &Tab, route: &str) {
    eval(
        tab,
        &format!("location.hash = {}", serde_json::json!(route)),
    );
}

/// Saves a PNG of the page under the test's target folder, and to docs/images/ when
/// `ATOMRL_UPDATE_SCREENSHOTS=1`.
fn screenshot(tab: &Tab, name: &str) {
    let png = tab
        .capture_screenshot(CaptureScreenshotFormatOption::Png, None, None, true)
        .unwrap();
    assert!(
        png.len() > 10_000,
        "{name}: a {}-byte screenshot",
        png.len()
    );
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(name), &png).unwrap();
    if std::env::var_os("ATOMRL_UPDATE_SCREENSHOTS").is_some_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/images");
        std::fs::create_dir_all(&docs).unwrap();
        std::fs::write(docs.join(name), &png).unwrap();
    }
}

/// Number of non-transparent pixels of the chart canvas of `metric`.
fn drawn_pixels(tab: &Tab, metric: &str) -> u64 {
    let js = format!(
        "(() => {{ const c = document.querySelector('div.chart[data-metric={m}] canvas'); \
         if (!c || !c.width) return 0; \
         const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data; \
         let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n; }})()",
        m = serde_json::json!(metric)
    );
    eval(tab, &js).as_u64().unwrap_or(0)
}

#[test]
fn dashboard_in_headless_chromium() {
    let Some(chrome) = chromium() else {
        assert!(
            std::env::var_os("ATOMRL_REQUIRE_BROWSER").is_none(),
            "ATOMRL_REQUIRE_BROWSER is set but no Chromium was found (apt-get install chromium)"
        );
        eprintln!("skipped: no Chromium (apt-get install chromium, or set CHROME)");
        return;
    };
    let root = common::fixture_runs("browser");
    let url = common::serve(root.path());
    let profile = common::temp_dir("browser-profile");
    let args: Vec<&OsStr> = [
        "--disable-gpu",
        "--disable-quic",
        "--disable-component-update",
        "--no-default-browser-check",
    ]
    .iter()
    .map(OsStr::new)
    .collect();
    let browser = Browser::new(LaunchOptions {
        path: Some(chrome),
        headless: true,
        sandbox: false,
        window_size: Some((1440, 1000)),
        user_data_dir: Some(profile.path().to_path_buf()),
        idle_browser_timeout: Duration::from_secs(120),
        args,
        ..LaunchOptions::default()
    })
    .expect("Chromium starts");
    let tab = browser.new_tab().unwrap();
    tab.set_default_timeout(Duration::from_secs(20));

    // 1. The runs list, with each run's status.
    tab.navigate_to(&format!("{url}/#/")).unwrap();
    tab.wait_until_navigated().unwrap();
    tab.wait_for_element("tr[data-run=\"grpo-a\"]").unwrap();
    assert_eq!(
        eval(
            &tab,
            "document.querySelectorAll('#runs-table tbody tr[data-run]').length"
        ),
        7
    );
    let status = |run: &str| {
        eval(
            &tab,
            &format!("document.querySelector('tr[data-run=\"{run}\"] span.status').textContent"),
        )
    };
    assert!(status("grpo-a").as_str().unwrap().contains("finished"));
    assert!(status("killed-c").as_str().unwrap().contains("resumable"));
    assert!(status("failed-d").as_str().unwrap().contains("failed"));
    screenshot(&tab, "dashboard-runs.png");

    // 2. A run's charts, drawn.
    route(&tab, "#/run/grpo-a");
    tab.wait_for_element("div.chart[data-metric=\"reward/mean\"][data-points]")
        .unwrap();
    wait_true(
        &tab,
        "document.querySelector('div.chart[data-metric=\"reward/mean\"]').dataset.points === '200'",
        "200 reward points",
    );
    assert!(
        drawn_pixels(&tab, "reward/mean") > 500,
        "the reward chart is blank"
    );
    assert!(
        drawn_pixels(&tab, "eval/accuracy") > 100,
        "the eval chart is blank"
    );
    let groups = eval(
        &tab,
        "[...document.querySelectorAll('section.chart-group')].map(s => s.dataset.group).join(',')",
    );
    assert!(
        groups.as_str().unwrap().contains("reward") && groups.as_str().unwrap().contains("eval"),
        "{groups}"
    );
    assert_eq!(
        eval(
            &tab,
            "document.querySelectorAll('#messages .message.error').length"
        ),
        0
    );
    screenshot(&tab, "dashboard-run.png");

    // 3. The rollout browser, filtered.
    tab.wait_for_element("#tab-rollouts")
        .unwrap()
        .click()
        .unwrap();
    tab.wait_for_element("#rollout-count").unwrap();
    wait_true(
        &tab,
        "document.querySelector('#rollout-count').textContent.trim() === '8 of 8 completions'",
        "8 completions of step 20",
    );
    assert_eq!(
        eval(
            &tab,
            "document.querySelectorAll('div.rollout-group').length"
        ),
        2
    );
    let tool_calls = eval(
        &tab,
        "document.querySelectorAll('div.rollout li.tool-call').length",
    );
    assert_eq!(tool_calls, 1);
    // The completion's markup is text, not HTML.
    assert_eq!(
        eval(
            &tab,
            "document.querySelectorAll('div.rollout pre.completion b').length"
        ),
        0
    );
    assert_eq!(eval(&tab, "[...document.querySelectorAll('div.rollout pre.completion')].every(p => p.textContent.includes('<b>not bold</b>'))"), true);
    set_control(&tab, "#rollout-correct", "correct");
    let correct_count = eval(
        &tab,
        "document.querySelectorAll('div.rollout[data-correct=\"true\"]').length",
    )
    .as_u64()
    .unwrap();
    assert!(correct_count > 0 && correct_count < 8);
    wait_true(&tab, &format!("document.querySelector('#rollout-count').textContent.trim() === '{correct_count} of 8 completions'"), "the correct filter");
    assert_eq!(
        eval(
            &tab,
            "document.querySelectorAll('div.rollout[data-correct=\"false\"]').length"
        ),
        0
    );
    set_control(&tab, "#rollout-correct", "all");
    set_control(&tab, "#rollout-min-reward", "1");
    wait_true(
        &tab,
        "[...document.querySelectorAll('div.rollout')].every(r => Number(r.dataset.reward) >= 1)",
        "the reward filter",
    );
    set_control(&tab, "#rollout-min-reward", "");
    // Length: at most 40 tokens (record i has 20 + 7·i tokens: three of them).
    set_control(&tab, "#rollout-max-length", "40");
    wait_true(
        &tab,
        "document.querySelector('#rollout-count').textContent.trim() === '3 of 8 completions'",
        "the length filter",
    );
    set_control(&tab, "#rollout-max-length", "");
    set_control(&tab, "#rollout-finish", "truncated");
    wait_true(
        &tab,
        "document.querySelector('#rollout-count').textContent.trim() === '1 of 8 completions'",
        "the truncated filter",
    );
    set_control(&tab, "#rollout-finish", "all");
    set_control(&tab, "#rollout-sort", "length-desc");
    wait_true(&tab, "(() => { const r = [...document.querySelectorAll('div.rollout')]; return r.length === 8 && document.querySelectorAll('div.rollout-group').length === 0; })()", "the flat list sorted by length");
    screenshot(&tab, "dashboard-rollouts.png");

    // 4. Two runs compared: the configuration difference.
    route(&tab, "#/");
    tab.wait_for_element("tr[data-run=\"grpo-b\"] input.compare-select")
        .unwrap();
    tab.find_element("tr[data-run=\"grpo-a\"] input.compare-select")
        .unwrap()
        .click()
        .unwrap();
    tab.find_element("tr[data-run=\"grpo-b\"] input.compare-select")
        .unwrap()
        .click()
        .unwrap();
    tab.find_element("#compare-button")
        .unwrap()
        .click()
        .unwrap();
    tab.wait_for_element("#compare-config tr[data-key=\"lr\"]")
        .unwrap();
    let lr = eval(
        &tab,
        "document.querySelector('#compare-config tr[data-key=\"lr\"]').innerText",
    );
    let lr = lr.as_str().unwrap();
    assert!(lr.contains("0.000001") && lr.contains("0.000002"), "{lr}");
    assert!(
        eval(
            &tab,
            "document.querySelector('#compare-config tr[data-key=\"output_dir\"]') === null"
        ) == true
    );
    tab.wait_for_element("#compare-charts div.chart[data-metric=\"reward/mean\"] canvas")
        .unwrap();
    screenshot(&tab, "dashboard-compare.png");

    // 5. A live run: a metrics line appended shows up without a reload.
    route(&tab, "#/run/grpo-b");
    let points = "document.querySelector('div.chart[data-metric=\"reward/mean\"]')?.dataset.points";
    wait_true(
        &tab,
        &format!("{points} === '120'"),
        "the running run's 120 points",
    );
    eval(&tab, "window.__sameDocument = true");
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(root.path().join("grpo-b/metrics.jsonl"))
        .unwrap();
    for step in 121..=123 {
        f.write_all(common::metrics_row(step, 1_764_001_000.0 + step as f64).as_bytes())
            .unwrap();
    }
    drop(f);
    wait_true(
        &tab,
        &format!("{points} === '123'"),
        "the chart to take the appended rows",
    );
    assert_eq!(
        eval(&tab, "window.__sameDocument === true"),
        true,
        "the page reloaded"
    );
}
