//! config/default.toml documents every option: it must parse to exactly the built-in defaults,
//! and every option of the built-in defaults must appear in it.

use lcm::core::config::Config;

fn default_toml() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/default.toml"))
        .expect("config/default.toml")
}

#[test]
fn default_toml_is_the_built_in_default() {
    assert_eq!(
        Config::from_toml(&default_toml()).unwrap(),
        Config::default()
    );
}

#[test]
fn default_toml_mentions_every_option() {
    let text = default_toml();
    let defaults = toml::Value::try_from(Config::default()).unwrap();
    let toml::Value::Table(sections) = defaults else {
        panic!("config is a table")
    };
    for (section, value) in sections {
        assert!(
            text.contains(&format!("[{section}]")),
            "section [{section}] missing"
        );
        if let toml::Value::Table(options) = value {
            for option in options.keys() {
                assert!(
                    text.contains(&format!("{option} ="))
                        || text.contains(&format!("[{section}.{option}]")),
                    "option {section}.{option} is not documented in config/default.toml"
                );
            }
        }
    }
    // Options without a default value are documented as comments.
    assert!(text.contains("# data_dir ="));
    assert!(text.contains("# max_depth ="));
}
