//! The option enums' serde names agree with their `FromStr` names and aliases.

#![allow(clippy::unwrap_used)]

use std::str::FromStr;

use atomrl_loss::{KlEstimator, LossAgg, RatioLevel};
use serde::de::DeserializeOwned;
use serde::Serialize;

fn agrees<T>(names: &[&str])
where
    T: FromStr + Serialize + DeserializeOwned + PartialEq + std::fmt::Debug + std::fmt::Display,
    T::Err: std::fmt::Debug,
{
    for name in names {
        let parsed = T::from_str(name).unwrap();
        let de: T = serde_json::from_value(serde_json::json!(name)).unwrap();
        assert_eq!(de, parsed, "{name}");
        // Serialised as the canonical name.
        assert_eq!(
            serde_json::to_value(&de).unwrap(),
            serde_json::json!(de.to_string())
        );
    }
    assert!(serde_json::from_value::<T>(serde_json::json!("no_such_name")).is_err());
}

#[test]
fn serde_accepts_every_from_str_name() {
    agrees::<KlEstimator>(&KlEstimator::ACCEPTED);
    agrees::<LossAgg>(&LossAgg::ACCEPTED);
    agrees::<RatioLevel>(&["token", "sequence", "gspo"]);
}
