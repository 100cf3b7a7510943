//! Loading [`GRPOArgs`]: preset defaults, then the TOML file, then `--set key=value` overrides.

use std::path::Path;
use std::str::FromStr;

use atomrl_core::{Error, Result};

use super::args::{GRPOArgs, Recipe};
use super::resume::Resume;
use atomrl_core::DeviceSpec;

const FUNC: &str = "config";

/// Builds the arguments of a run: the defaults of the recipe (from `recipe`, else the file's or
/// an override's `recipe` key, else GRPO), the TOML file on top, then each `key=value` of
/// `overrides` (TOML values: `lr=3e-4`, `lora.r=8`, `rewards=[{name="correctness"}]`; a bare
/// word is a string). Unknown keys and bad values are rejected naming the key.
///
/// # Errors
/// [`Error::File`] for an unreadable or malformed file (with its line), [`Error::Value`] /
/// [`Error::UnknownArgument`] naming the key for unknown keys and bad values.
///
/// ```
/// use atomrl_config::{load_args, Recipe};
/// let args = load_args(None, Some(Recipe::Dapo), &["lr=3e-4".into(), "model=tiny".into(), "dataset=d.jsonl".into()])?;
/// assert_eq!((args.lr, args.clip_high), (3e-4, 0.28));
/// assert!(load_args(None, None, &["lrr=1".into()]).unwrap_err().to_string().contains("lrr"));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn load_args(
    path: Option<&Path>,
    recipe: Option<Recipe>,
    overrides: &[String],
) -> Result<GRPOArgs> {
    let mut table = match path {
        Some(p) => read_table(p)?,
        None => toml::Table::new(),
    };
    for item in overrides {
        apply_override(&mut table, item)?;
    }
    let recipe = match recipe {
        Some(r) => r,
        None => match table.get("recipe") {
            Some(toml::Value::String(s)) => s.parse::<Recipe>()?,
            Some(v) => {
                return Err(Error::unknown_choice(
                    FUNC,
                    "recipe",
                    &Recipe::NAMES,
                    &v.to_string(),
                ))
            }
            None => Recipe::Grpo,
        },
    };
    table.insert("recipe".into(), recipe.name().into());
    let preset = preset_table(recipe);
    let mut merged = preset.clone();
    for (k, v) in &table {
        merged.insert(k.clone(), v.clone());
    }
    let args: GRPOArgs = match toml::Value::Table(merged).try_into() {
        Ok(args) => args,
        Err(e) => return Err(name_the_key(&preset, &table, &e)),
    };
    super::validate::validate(&args)?;
    Ok(args)
}

/// The preset files: `grpo.toml` holds every default, the others only what they change.
const GRPO_PRESET: &str = include_str!("../presets/grpo.toml");
const DAPO_PRESET: &str = include_str!("../presets/dapo.toml");
const SFT_PRESET: &str = include_str!("../presets/sft.toml");
const PPO_PRESET: &str = include_str!("../presets/ppo.toml");
const A2C_PRESET: &str = include_str!("../presets/a2c.toml");
const TRPO_PRESET: &str = include_str!("../presets/trpo.toml");
const DPO_PRESET: &str = include_str!("../presets/dpo.toml");
const REWARD_PRESET: &str = include_str!("../presets/reward.toml");

/// The defaults of `recipe` as a TOML table: `grpo.toml` with the recipe's own file on top
/// (its keys replace whole values, so `rewards = []` empties the list), and `recipe` set.
pub(super) fn preset_table(recipe: Recipe) -> toml::Table {
    let own = match recipe {
        Recipe::Grpo => "",
        Recipe::Dapo => DAPO_PRESET,
        Recipe::Sft => SFT_PRESET,
        Recipe::Ppo => PPO_PRESET,
        Recipe::A2c => A2C_PRESET,
        Recipe::Trpo => TRPO_PRESET,
        Recipe::Dpo => DPO_PRESET,
        Recipe::Reward => REWARD_PRESET,
    };
    let mut table = toml::Table::new();
    for text in [GRPO_PRESET, own] {
        // Embedded files, all of them parsed by this module's tests: not user input.
        let file: toml::Table = text
            .parse()
            .unwrap_or_else(|e| panic!("a preset file of recipe {recipe}: {e}"));
        table.extend(file);
    }
    table.insert("recipe".into(), recipe.name().into());
    table
}

/// The error of a configuration that does not deserialise, naming the key at fault: the first
/// key of `table` that fails on its own over the `preset` (serde's own messages name the
/// expected type or choices, not the key).
fn name_the_key(preset: &toml::Table, table: &toml::Table, whole: &toml::de::Error) -> Error {
    for (key, value) in table {
        let mut one = preset.clone();
        one.insert(key.clone(), value.clone());
        if let Err(e) = toml::Value::Table(one).try_into::<GRPOArgs>() {
            // The choices parsed from a string already name the key in their own error.
            let own = match (key.as_str(), value.as_str()) {
                ("device", Some(v)) => v.parse::<DeviceSpec>().err(),
                ("resume", Some(v)) => v.parse::<Resume>().err(),
                _ => None,
            };
            if let Some(own) = own {
                return own;
            }
            let expected = if preset.contains_key(key) || KNOWN_OPTIONAL.contains(&key.as_str()) {
                "a valid value"
            } else {
                "a known key"
            };
            return Error::value(FUNC, key, expected, e.message());
        }
    }
    Error::value(
        FUNC,
        "configuration",
        "known keys with valid values",
        whole.message(),
    )
}

/// The keys of [`GRPOArgs`] whose default is absent (so the preset table has no entry).
const KNOWN_OPTIONAL: [&str; 5] = [
    "eval_dataset",
    "clip_ratio_c",
    "overlong_buffer_len",
    "lora",
    "system_prompt",
];

fn read_table(path: &Path) -> Result<toml::Table> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::file(path.display(), e))?;
    toml::from_str(&text).map_err(|e: toml::de::Error| {
        let line = e.span().map(|s| text[..s.start].lines().count().max(1));
        let at = line.map_or_else(
            || path.display().to_string(),
            |l| format!("{}:{l}", path.display()),
        );
        Error::file(at, e.message())
    })
}

/// Sets one `key=value` override in a configuration table, as `load_args` and `--set` do: a
/// TOML value (a bare word is a string), a dotted key into nested tables.
///
/// # Errors
/// An item without `=` or with an empty key, or a dotted key through a value that is not a
/// table.
///
/// ```
/// let mut t = toml::Table::new();
/// atomrl_config::apply_override(&mut t, "lora.r=8")?;
/// atomrl_config::apply_override(&mut t, "model=tiny")?;
/// assert_eq!(t["lora"]["r"].as_integer(), Some(8));
/// assert_eq!(t["model"].as_str(), Some("tiny"));
/// # Ok::<(), atomrl_core::Error>(())
/// ```
pub fn apply_override(table: &mut toml::Table, item: &str) -> Result<()> {
    let (key, value) = parse_override(item)?;
    set_path(table, &key, value)
}

/// The leaves of a configuration table as `(dotted key, value)` pairs, in the table's
/// iteration order (sorted by key):
/// the inverse of [`apply_override`] (`lora.r` for `[lora] r = 8`).
///
/// ```
/// let t: toml::Table = toml::from_str("lr = 1e-4\n[lora]\nr = 8\n")?;
/// let keys: Vec<String> = atomrl_config::flatten_table(&t).into_iter().map(|(k, _)| k).collect();
/// assert_eq!(keys, ["lora.r", "lr"]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn flatten_table(table: &toml::Table) -> Vec<(String, toml::Value)> {
    fn walk(prefix: &str, t: &toml::Table, out: &mut Vec<(String, toml::Value)>) {
        for (k, v) in t {
            let key = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            match v {
                toml::Value::Table(inner) => walk(&key, inner, out),
                other => out.push((key, other.clone())),
            }
        }
    }
    let mut out = Vec::new();
    walk("", table, &mut out);
    out
}

/// The keys whose values differ between flattened configurations (a key missing from some
/// counts as differing), sorted; `output_dir`, which always differs between runs, left out.
///
/// ```
/// use std::collections::BTreeMap;
/// let a: BTreeMap<String, String> = [("lr".into(), "1e-6".into()), ("seed".into(), "1".into()), ("output_dir".into(), "a".into())].into();
/// let b: BTreeMap<String, String> = [("lr".into(), "2e-6".into()), ("seed".into(), "1".into()), ("output_dir".into(), "b".into())].into();
/// assert_eq!(atomrl_config::differing_keys(&[&a, &b]), ["lr"]);
/// ```
pub fn differing_keys(configs: &[&std::collections::BTreeMap<String, String>]) -> Vec<String> {
    let keys: std::collections::BTreeSet<&String> = configs.iter().flat_map(|c| c.keys()).collect();
    keys.into_iter()
        .filter(|k| k.as_str() != "output_dir")
        .filter(|k| {
            let first = configs.first().and_then(|c| c.get(*k));
            configs.iter().any(|c| c.get(*k) != first)
        })
        .cloned()
        .collect()
}

/// `key=value` → (key, TOML value); a value that is not valid TOML is taken as a string.
fn parse_override(item: &str) -> Result<(String, toml::Value)> {
    let (key, raw) = item
        .split_once('=')
        .ok_or_else(|| Error::value(FUNC, "--set", "key=value", item))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(Error::value(
            FUNC,
            "--set",
            "key=value with a non-empty key",
            item,
        ));
    }
    let raw = raw.trim();
    let value = toml::Table::from_str(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    Ok((key.to_string(), value))
}

fn set_path(table: &mut toml::Table, key: &str, value: toml::Value) -> Result<()> {
    match key.split_once('.') {
        None => {
            table.insert(key.to_string(), value);
            Ok(())
        }
        Some((head, rest)) => {
            let entry = table
                .entry(head.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            match entry {
                toml::Value::Table(inner) => set_path(inner, rest, value),
                other => Err(Error::value(
                    FUNC,
                    head,
                    "a table (for a dotted key)",
                    other.type_str(),
                )),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn base() -> Vec<String> {
        vec!["model=m".into(), "dataset=d.jsonl".into()]
    }

    #[test]
    fn file_then_overrides() {
        let dir = std::env::temp_dir().join(format!("atomrl-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.toml");
        std::fs::write(&path, "recipe = \"dapo\"\nmodel = \"m\"\ndataset = \"d.jsonl\"\nlr = 1e-5\n[lora]\nr = 8\nalpha = 16\n").unwrap();
        let args = load_args(Some(&path), None, &["lr=2e-5".into(), "lora.r=4".into()]).unwrap();
        assert_eq!(args.recipe, Recipe::Dapo);
        assert_eq!(args.lr, 2e-5);
        assert_eq!(args.lora.as_ref().map(|l| (l.r, l.alpha)), Some((4, 16.0)));
        assert!(args.dynamic_sampling);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn sizes_past_what_a_machine_holds_name_the_key_before_the_run() {
        let err = |extra: &[&str]| {
            let mut o = base();
            o.extend(extra.iter().map(|s| s.to_string()));
            load_args(None, None, &o).unwrap_err().to_string()
        };
        let e = err(&["batch_size=99999999999"]);
        assert!(
            e.contains("`batch_size`")
                && e.contains("is at most 1048576")
                && e.contains("got 99999999999 (× num_generations 8 = 799999999992 rows)"),
            "{e}"
        );
        let e = err(&["num_generations=99999999999"]);
        assert!(e.contains("`num_generations`"), "{e}");
        // The product overflows usize: still the same error, not a wrapped small number.
        let e = err(&["batch_size=4294967296", "num_generations=4294967296"]);
        assert!(e.contains("more than usize holds"), "{e}");
        let e = err(&["workers=99999999999"]);
        assert!(e.contains("`workers`") && e.contains("at most 1024"), "{e}");
        let e = err(&["output_dir=\"\""]);
        assert!(e.contains("`output_dir`"), "{e}");
        let e = err(&["threads=3000"]);
        assert!(e.contains("`threads`") && e.contains("at most 1024"), "{e}");
        let mut o = base();
        o.extend(["batch_size=1024".into(), "num_generations=1024".into()]);
        assert!(load_args(None, None, &o).is_ok());
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let mut o = base();
        o.push("learning_rate=1".into());
        let e = load_args(None, None, &o).unwrap_err().to_string();
        assert!(e.contains("learning_rate"), "{e}");
        let mut o = base();
        o.push("batch_size=\"eight\"".into());
        let e = load_args(None, None, &o).unwrap_err().to_string();
        assert!(
            e.contains("`batch_size`") && e.contains("invalid type"),
            "{e}"
        );
        let mut o = base();
        o.push("lr=\"fast\"".into());
        let e = load_args(None, None, &o).unwrap_err().to_string();
        assert!(e.contains("`lr`") && e.contains("expected f64"), "{e}");
        let mut o = base();
        o.push("lora.r=\"x\"".into());
        let e = load_args(None, None, &o).unwrap_err().to_string();
        assert!(e.contains("`lora`"), "{e}");
        let mut o = base();
        o.push("lr=-1".into());
        let e = load_args(None, None, &o).unwrap_err().to_string();
        assert!(e.contains("`lr`"), "{e}");
        let mut o = base();
        o.push("attention_scores_budget=0".into());
        let e = load_args(None, None, &o).unwrap_err().to_string();
        assert!(
            e.contains("`attention_scores_budget`") && e.contains(">= 1"),
            "{e}"
        );
        let mut o = base();
        o.push("attention_scores_budget=4096".into());
        assert_eq!(
            load_args(None, None, &o).unwrap().attention_scores_budget,
            Some(4096)
        );
    }

    #[test]
    fn the_lr_horizon_needs_an_exponent_in_range() {
        let mut o = base();
        o.extend([
            "lr_horizon_steps=1000".into(),
            "lr_horizon_exponent=0.15".into(),
        ]);
        let a = load_args(None, None, &o).unwrap();
        assert_eq!((a.lr_horizon_steps, a.lr_horizon_exponent), (1000, 0.15));
        assert_eq!(load_args(None, None, &base()).unwrap().lr_horizon_steps, 0);
        // 0 steps turn the rule off whatever the exponent.
        o.push("lr_horizon_steps=0".into());
        assert!(load_args(None, None, &o).is_ok());
        for (sets, key, expected) in [
            (
                &["lr_horizon_steps=1000"][..],
                "`lr_horizon_exponent`",
                "when lr_horizon_steps is set (it is 1000)",
            ),
            (
                &["lr_horizon_steps=10", "lr_horizon_exponent=1.5"][..],
                "`lr_horizon_exponent`",
                "in [0, 1]",
            ),
        ] {
            let mut o = base();
            o.extend(sets.iter().map(|s| s.to_string()));
            let e = load_args(None, None, &o).unwrap_err().to_string();
            assert!(e.contains(key) && e.contains(expected), "{sets:?}: {e}");
        }
    }

    #[test]
    fn actor_critic_presets_need_a_critic_lr_and_check_its_ranges() {
        for recipe in [Recipe::Ppo, Recipe::A2c, Recipe::Trpo] {
            let e = load_args(None, Some(recipe), &base())
                .unwrap_err()
                .to_string();
            assert!(e.contains("`critic.lr`"), "{recipe}: {e}");
            let mut o = base();
            o.push("critic.lr=1e-5".into());
            let a = load_args(None, Some(recipe), &o).unwrap();
            assert_eq!((a.num_generations, a.batch_size), (1, 64), "{recipe}");
            let u = a.update();
            let vanilla = u.loss.objective == crate::PolicyObjective::VanillaGradient;
            assert_eq!(vanilla, recipe == Recipe::A2c, "{recipe}");
            let x = a.experience(vec![], 0);
            assert!(!x.group_advantages && !x.drop_zero_advantage, "{recipe}");
            assert_eq!(x.old_log_probs, recipe != Recipe::A2c, "{recipe}");
        }
        for (set, key) in [
            ("critic.gamma=1.5", "`critic.gamma`"),
            ("critic.lam=-0.5", "`critic.lam`"),
            ("critic.actor_lam=1.01", "`critic.actor_lam`"),
            ("critic.vf_coef=0", "`critic.vf_coef`"),
            ("critic.kl_target=-1", "`critic.kl_target`"),
            ("trpo.max_kl=0", "`trpo.max_kl`"),
            ("trpo.cg_iters=0", "`trpo.cg_iters`"),
            ("critic.share_backbone=true", "`critic.share_backbone`"),
            ("critic.num_layers=0", "`critic.num_layers`"),
            ("critic.intermediate_size=0", "`critic.intermediate_size`"),
            (
                "critic.num_attention_heads=0",
                "`critic.num_attention_heads`",
            ),
            (
                "critic.actor_skip_flat_groups=true",
                "`critic.actor_skip_flat_groups`",
            ),
            ("critic.gama=1", "gama"),
        ] {
            let mut o = base();
            o.extend(["critic.lr=1e-5".into(), set.into()]);
            let e = load_args(None, Some(Recipe::Trpo), &o)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{set}: {e}");
        }
        // A shared head reads the policy: a critic folder of its own contradicts it.
        let mut o = base();
        o.extend([
            "critic.lr=1e-5".into(),
            "critic.share_backbone=true".into(),
            "critic.model=\"critic\"".into(),
        ]);
        let e = load_args(None, Some(Recipe::Ppo), &o)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`critic.share_backbone`"), "{e}");
        o.pop();
        assert!(
            load_args(None, Some(Recipe::Ppo), &o)
                .unwrap()
                .critic()
                .share_backbone
        );
        // Each of these contradicts a shared head.
        for (set, key) in [
            (
                "critic.actor_skip_flat_groups=true",
                "`critic.actor_skip_flat_groups`",
            ),
            ("critic.num_layers=2", "`critic.num_layers`"),
            ("critic.intermediate_size=64", "`critic.intermediate_size`"),
            (
                "critic.num_attention_heads=2",
                "`critic.num_attention_heads`",
            ),
        ] {
            o.push(set.into());
            let e = load_args(None, Some(Recipe::Ppo), &o)
                .unwrap_err()
                .to_string();
            assert!(e.contains(key), "{set}: {e}");
            o.pop();
        }
        // A KL in the reward leaves the loss without one, and needs the old log-probs.
        let mut o = base();
        o.extend([
            "critic.lr=1e-5".into(),
            "beta=0.1".into(),
            "num_iterations=1".into(),
        ]);
        let a = load_args(None, Some(Recipe::Ppo), &o).unwrap();
        assert_eq!(a.update().loss.beta, 0.0);
        assert!(a.experience(vec![], 0).old_log_probs);
        o.push("critic.kl_in_reward=false".into());
        let a = load_args(None, Some(Recipe::Ppo), &o).unwrap();
        assert_eq!(a.update().loss.beta, 0.1);
        assert!(!a.experience(vec![], 0).old_log_probs);
    }

    #[test]
    fn closed_choices_are_parsed_once_into_enums() {
        let mut o = base();
        o.extend([
            "kl_estimator=low_var_kl".into(),
            "loss_agg=dr_grpo".into(),
            "ratio_level=gspo".into(),
            "advantage_mode=rloo".into(),
            "dtype=bf16".into(),
            "device=cuda:1".into(),
            "resume=auto".into(),
        ]);
        let a = load_args(None, None, &o).unwrap();
        assert_eq!(a.kl_estimator, atomrl_loss::KlEstimator::K3);
        assert_eq!(a.loss_agg, atomrl_loss::LossAgg::SeqMeanTokenSumNorm);
        assert_eq!(a.ratio_level, atomrl_loss::RatioLevel::Sequence);
        assert_eq!(a.advantage_mode, atomrl_advantage::AdvantageMode::Rloo);
        assert_eq!(a.dtype, super::super::ComputeDtype::Bf16);
        assert_eq!(a.device, super::super::DeviceSpec::Cuda(Some(1)));
        assert_eq!(a.resume, super::super::Resume::Auto);
        for (item, key) in [
            ("kl_estimator=k9", "`kl_estimator`"),
            ("loss_agg=mean", "`loss_agg`"),
            ("ratio_level=word", "`ratio_level`"),
            ("advantage_mode=ppo", "`advantage_mode`"),
            ("dtype=f64", "`dtype`"),
            ("device=tpu", "`device`"),
            ("resume=3", "`resume`"),
        ] {
            let mut o = base();
            o.push(item.into());
            let e = load_args(None, None, &o).unwrap_err().to_string();
            assert!(e.contains(key), "{item}: {e}");
        }
    }

    #[test]
    fn malformed_file_names_the_line() {
        let dir = std::env::temp_dir().join(format!("atomrl-config-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.toml");
        std::fs::write(&path, "model = \"m\"\nlr = = 3\n").unwrap();
        let e = load_args(Some(&path), None, &[]).unwrap_err().to_string();
        assert!(e.contains("bad.toml:2"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
