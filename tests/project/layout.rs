//! The house's layout: no module folder of `src/` imports itself in a loop, so each can be read
//! bottom-up (Rust compiles module cycles silently, so nothing else would stop one growing).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The modules of `folder` (its `.rs` files, `mod.rs` as `mod`; at the top, its folders instead,
/// each read whole) with their code, unit tests and comments left out.
fn modules(folder: &Path, top: bool) -> BTreeMap<String, String> {
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_str().unwrap().to_string();
        if path.is_dir() && top {
            let files = std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path());
            modules
                .insert(name, files.filter(|f| f.extension().is_some_and(|e| e == "rs")).map(|f| code(&f)).collect());
        } else if path.extension().is_some_and(|e| e == "rs")
            && !["main", "lib"].contains(&name.as_str())
            && (name != "mod" || !top)
        {
            modules.insert(name, code(&path));
        }
    }
    modules
}

fn code(file: &Path) -> String {
    let text = std::fs::read_to_string(file).unwrap();
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap();
    text.lines().map(|line| line.split("//").next().unwrap()).collect::<Vec<_>>().join("\n")
}

/// Which of `modules` each one imports, by `prefixes` (`super::`, `crate::policy::`). A name
/// there that is no module is `mod.rs`'s own (an arrow up to it); `mod.rs` imports a child it
/// names a path through (`use child::…`, `child::f()`). `folders`: the child folders, modules
/// too, whose own imports are not followed.
fn imports(
    modules: &BTreeMap<String, String>,
    prefixes: &[String],
    folders: &BTreeSet<String>,
) -> BTreeMap<String, BTreeSet<String>> {
    modules
        .iter()
        .map(|(module, code)| {
            let mut used = BTreeSet::new();
            if module == "mod" {
                for child in modules.keys().filter(|m| *m != "mod") {
                    let path = format!("{child}::");
                    let named = code.match_indices(&path).any(|(at, _)| {
                        code[..at].chars().next_back().is_none_or(|c| !c.is_alphanumeric() && c != '_' && c != ':')
                    });
                    if named {
                        used.insert(child.clone());
                    }
                }
                return (module.clone(), used);
            }
            for prefix in prefixes {
                for (at, _) in code.match_indices(prefix.as_str()) {
                    let rest = &code[at + prefix.len()..];
                    // `super::busy::…`, or each name of `super::{busy::…, cost, …}`.
                    let names: Vec<&str> = match rest.strip_prefix('{') {
                        Some(group) => group.split('}').next().unwrap().split(',').collect(),
                        None => vec![rest],
                    };
                    for name in names {
                        let name = name.trim().split(|c: char| !c.is_alphanumeric() && c != '_').next().unwrap();
                        if modules.contains_key(name) && name != module {
                            used.insert(name.to_string());
                        } else if !modules.contains_key(name)
                            && !folders.contains(name)
                            && modules.contains_key("mod")
                            && name != "super"
                        {
                            used.insert("mod".to_string());
                        }
                    }
                }
            }
            (module.clone(), used)
        })
        .collect()
}

/// Modules from which `start` can be reached again, following imports.
fn in_a_loop_with(start: &str, graph: &BTreeMap<String, BTreeSet<String>>) -> BTreeSet<String> {
    let reaches = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.to_string()];
        while let Some(module) = todo.pop() {
            for next in &graph[&module] {
                if seen.insert(next.clone()) {
                    todo.push(next.clone());
                }
            }
        }
        seen
    };
    reaches(start).into_iter().filter(|other| other != start && reaches(other).contains(start)).collect()
}

#[test]
fn no_module_folder_imports_itself_in_a_loop() {
    let src = Path::new(ROOT).join("src");
    let top = imports(&modules(&src, true), &["crate::".to_string()], &BTreeSet::new());
    for module in top.keys() {
        let others = in_a_loop_with(module, &top);
        assert!(others.is_empty(), "src/{module} imports itself back through {others:?}");
    }
    let folders: Vec<_> = top.keys().filter(|m| src.join(m).is_dir()).collect();
    assert!(folders.iter().any(|f| *f == "policy"), "the folders of src/ are found: {folders:?}");
    let mut checked = Vec::new();
    for parent in folders {
        no_loop_within(&src, parent, &mut checked);
    }
    assert!(checked.iter().any(|f| f == "policy/outcome"), "folders within folders too: {checked:?}");
}

/// No module of the folder `src/{folder}` imports itself back, nor does any of its own folders'.
fn no_loop_within(src: &Path, folder: &str, checked: &mut Vec<String>) {
    let children = std::fs::read_dir(src.join(folder)).unwrap().map(|e| e.unwrap().path());
    let folders: BTreeSet<String> =
        children.filter(|p| p.is_dir()).map(|p| p.file_name().unwrap().to_str().unwrap().to_string()).collect();
    let prefixes = ["super::".into(), format!("crate::{}::", folder.replace('/', "::"))];
    let graph = imports(&modules(&src.join(folder), false), &prefixes, &folders);
    for module in graph.keys() {
        let others = in_a_loop_with(module, &graph);
        assert!(others.is_empty(), "src/{folder}/{module}.rs imports itself back through {others:?}");
    }
    checked.push(folder.to_string());
    for child in &folders {
        no_loop_within(src, &format!("{folder}/{child}"), checked);
    }
}

#[test]
fn an_import_loop_is_found() {
    let folder = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| std::fs::write(folder.path().join(name), text).unwrap();
    write("a.rs", "use super::b::B;\n");
    write("b.rs", "use super::{c::C, other};\n");
    write("c.rs", "use crate::house::a::A;\n#[cfg(test)]\nmod tests {\n    use super::super::d::D;\n}\n");
    write("d.rs", "// use super::a::A;\n");
    let graph = imports(&modules(folder.path(), false), &["super::".into(), "crate::house::".into()], &BTreeSet::new());
    assert_eq!(in_a_loop_with("a", &graph), BTreeSet::from(["b".to_string(), "c".to_string()]));
    assert!(in_a_loop_with("d", &graph).is_empty(), "comments and tests are not imports");
    // A child that imports what its mod.rs holds, while mod.rs imports the child: a loop too.
    write("mod.rs", "pub mod d;\npub use d::D;\npub struct Shared;\n");
    write("d.rs", "use super::Shared;\n");
    let graph = imports(&modules(folder.path(), false), &["super::".into(), "crate::house::".into()], &BTreeSet::new());
    assert_eq!(in_a_loop_with("d", &graph), BTreeSet::from(["mod".to_string()]));
}

/// No file of `src/` holds more than 400 lines before its unit tests: a file that grows past
/// that is two things, and is split where it says so.
#[test]
fn no_file_of_src_is_over_400_lines_of_code() {
    fn files(folder: &Path, found: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(folder).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files(&path, found);
            } else if path.extension().is_some_and(|e| e == "rs") {
                found.push(path);
            }
        }
    }
    let mut all = Vec::new();
    files(&Path::new(ROOT).join("src"), &mut all);
    let long: Vec<String> = all
        .iter()
        .filter_map(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            let code = text.lines().take_while(|line| !line.starts_with("#[cfg(test)]")).count();
            (code > 400).then(|| format!("{} ({code})", file.strip_prefix(ROOT).unwrap().display()))
        })
        .collect();
    assert!(long.is_empty(), "over 400 lines before their tests: {long:?}");
    assert!(all.len() > 50, "the files of src/ are found: {}", all.len());
}
