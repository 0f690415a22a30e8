//! `lcm import` of folder trees shaped like `~/.claude/projects` (built from the real
//! transcripts in ../shared/data, with sub-agent folders), of quoted globs, and of folders
//! holding what cannot be imported (a dangling link, a symbolic link loop, a JSON file that is
//! not a transcript, an unreadable file): each reported on its own line, the rest imported.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::common::{self, json, lcm};

/// `projects/<project>/<session>.jsonl` and `projects/<project>/<session>/subagents/*.jsonl`,
/// as Claude Code keeps them: two projects, the real sessions spread over them. The files of
/// the tree, in path order.
fn claude_projects(shared: &Path, root: &Path) -> Vec<PathBuf> {
    let sessions = common::real_sessions(shared);
    assert!(sessions.len() >= 2, "{sessions:?}");
    let mut files = Vec::new();
    for (n, session) in sessions.iter().enumerate() {
        let project = root.join(if n % 2 == 0 {
            "-home-me-app"
        } else {
            "-home-me-lib"
        });
        std::fs::create_dir_all(&project).unwrap();
        let name = session.file_name().unwrap();
        std::fs::copy(session, project.join(name)).unwrap();
        files.push(project.join(name));
        let subagents = session.with_extension("").join("subagents");
        if subagents.is_dir() {
            let target = project.join(session.file_stem().unwrap()).join("subagents");
            std::fs::create_dir_all(&target).unwrap();
            for agent in std::fs::read_dir(&subagents).unwrap() {
                let agent = agent.unwrap().path();
                if agent.extension().is_some_and(|e| e == "jsonl") {
                    std::fs::copy(&agent, target.join(agent.file_name().unwrap())).unwrap();
                    files.push(target.join(agent.file_name().unwrap()));
                }
            }
        }
    }
    files.sort();
    files
}

/// Sessions by key: their parent's key, message count and token total.
fn sessions_by_key(data: &Path) -> BTreeMap<String, (Option<String>, u64, u64)> {
    let sessions = json(&lcm(data, &["sessions", "--json"]));
    let sessions = sessions.as_array().unwrap();
    let key_of = |id: &Value| {
        sessions
            .iter()
            .find(|s| &s["id"] == id)
            .map(|s| s["key"].as_str().unwrap().to_owned())
    };
    sessions
        .iter()
        .map(|s| {
            (
                s["key"].as_str().unwrap().to_owned(),
                (
                    key_of(&s["parent"]),
                    s["message_count"].as_u64().unwrap(),
                    s["token_total"].as_u64().unwrap(),
                ),
            )
        })
        .collect()
}

#[test]
fn a_projects_tree_imports_as_its_files_one_by_one_and_once() {
    let Some(shared) = common::shared_data() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let projects = tmp.path().join("projects");
    let files = claude_projects(&shared, &projects);
    assert!(
        files
            .iter()
            .any(|f| f.to_string_lossy().contains("/subagents/")),
        "the tree has sub-agent transcripts"
    );

    let by_folder = tmp.path().join("by-folder");
    let out = lcm(&by_folder, &["import", projects.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    // A line per file, then the total.
    for file in &files {
        assert!(
            text.contains(&format!("{}: ", file.display())),
            "{} not reported:\n{text}",
            file.display()
        );
    }
    let total = text
        .lines()
        .find(|l| l.starts_with("total: "))
        .unwrap_or_else(|| panic!("no total line:\n{text}"));
    assert!(
        total.starts_with(&format!("total: {} files, ", files.len())),
        "{total}"
    );

    let one_by_one = tmp.path().join("one-by-one");
    for file in &files {
        let out = lcm(&one_by_one, &["import", "-q", file.to_str().unwrap()]);
        assert!(out.status.success(), "{out:?}");
    }
    let folder_sessions = sessions_by_key(&by_folder);
    assert_eq!(folder_sessions, sessions_by_key(&one_by_one));
    // Sub-agents are children of their parent session.
    let children = folder_sessions
        .values()
        .filter(|(p, _, _)| p.is_some())
        .count();
    let agent_files = files
        .iter()
        .filter(|f| f.to_string_lossy().contains("/subagents/"))
        .count();
    assert_eq!(children, agent_files);

    // A second run adds nothing.
    let again = json(&lcm(
        &by_folder,
        &["import", "--json", projects.to_str().unwrap()],
    ));
    assert_eq!(again["total"]["imported"], 0, "{}", again["total"]);
    assert_eq!(again["total"]["files"], files.len());
    assert_eq!(sessions_by_key(&by_folder), folder_sessions);

    // A quoted glob is expanded by lcm: the app project's sessions only.
    let by_glob = tmp.path().join("by-glob");
    let pattern = format!("{}/-home-me-app/*.jsonl", projects.display());
    let out = json(&lcm(&by_glob, &["import", "--json", &pattern]));
    let imported: Vec<&str> = out["imports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["path"].as_str().unwrap())
        .collect();
    let expected: Vec<String> = files
        .iter()
        .filter(|f| {
            f.parent().unwrap().ends_with("-home-me-app")
                && f.extension().is_some_and(|e| e == "jsonl")
        })
        .map(|f| f.display().to_string())
        .collect();
    assert_eq!(imported, expected);
    let out = lcm(
        &by_glob,
        &["import", &format!("{}/nothing-*.jsonl", projects.display())],
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing matches"));
}

#[cfg(unix)]
#[test]
fn what_cannot_be_imported_is_reported_per_file_and_the_rest_imported() {
    let tmp = tempfile::tempdir().unwrap();
    let folder = tmp.path().join("history");
    std::fs::create_dir_all(folder.join("nested")).unwrap();
    let example =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/transcripts/demo-session.jsonl");
    std::fs::copy(&example, folder.join("a-good.jsonl")).unwrap();
    std::fs::write(
        folder.join("nested/b-good.jsonl"),
        concat!(
            r#"{"session":"b","role":"user","content":"the blue heron"}"#,
            "\n",
            r#"{"session":"b","role":"assistant","content":"noted"}"#,
            "\n"
        ),
    )
    .unwrap();
    // Not a transcript: a configuration file.
    std::fs::write(
        folder.join("package.json"),
        r#"{"name": "x", "version": "1"}"#,
    )
    .unwrap();
    // A link to nowhere, a link to itself, and a folder link that leads back up.
    std::os::unix::fs::symlink(folder.join("gone.jsonl"), folder.join("dangling.jsonl")).unwrap();
    std::os::unix::fs::symlink(folder.join("self.jsonl"), folder.join("self.jsonl")).unwrap();
    std::os::unix::fs::symlink(&folder, folder.join("nested/loop")).unwrap();
    // Unreadable (root reads anything, so this one only counts for other users).
    let locked = folder.join("nested/locked.jsonl");
    std::fs::copy(&example, &locked).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    }
    let locked_out = std::fs::read(&locked).is_err();

    let data = tmp.path().join("data");
    let out = lcm(&data, &["import", folder.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    let not_imported = |name: &str| {
        stdout
            .lines()
            .any(|l| l.contains(name) && l.contains("not imported"))
    };
    assert!(not_imported("package.json"), "{stdout}");
    assert!(not_imported("dangling.jsonl"), "{stdout}");
    assert!(not_imported("self.jsonl"), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("nested/loop") && l.contains("symbolic link loop")),
        "{stdout}"
    );
    assert_eq!(not_imported("locked.jsonl"), locked_out, "{stdout}");
    let failed = 4 + usize::from(locked_out);
    assert!(
        stderr.contains(&format!("{failed} of ")) && stderr.contains("could not be imported"),
        "{stderr}"
    );
    // The good files are stored.
    let sessions = json(&lcm(&data, &["sessions", "--json"]));
    let keys: Vec<&str> = sessions
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["key"].as_str().unwrap())
        .collect();
    assert!(keys.contains(&"b"), "{keys:?}");
    assert!(keys.len() >= 2, "{keys:?}");
    let hits = json(&lcm(&data, &["grep", "--json", "blue heron"]));
    assert_eq!(hits["hits"].as_array().unwrap().len(), 1);
    // JSON says the same, per file.
    let again = lcm(&data, &["import", "--json", folder.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(report["not_imported"].as_array().unwrap().len(), failed);
    assert_eq!(report["total"]["imported"], 0);
}
