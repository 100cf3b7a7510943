//! `AdvantageMode`'s serde names agree with its `FromStr` names and aliases.

#![allow(clippy::unwrap_used)]

use std::str::FromStr;

use atomrl_advantage::AdvantageMode;

#[test]
fn serde_accepts_every_from_str_name() {
    let aliases = ["dr_grpo", "reinforce_plus_plus_baseline"];
    for name in AdvantageMode::NAMES.iter().chain(&aliases) {
        let parsed = AdvantageMode::from_str(name).unwrap();
        let de: AdvantageMode = serde_json::from_value(serde_json::json!(name)).unwrap();
        assert_eq!(de, parsed, "{name}");
        assert_eq!(
            serde_json::to_value(de).unwrap(),
            serde_json::json!(de.name())
        );
    }
    assert!(serde_json::from_value::<AdvantageMode>(serde_json::json!("ppo")).is_err());
}
