//! Source code: imports and top-level definitions with their signatures, from a tree-sitter
//! parse (Rust, Python, TypeScript, TSX, JavaScript, Go, Elixir): functions with parameters and
//! return types, structs/enums/traits/impl blocks with their methods, classes with their
//! methods, interfaces and type aliases, constants, modules. A signature is the definition's
//! text up to its body, whitespace collapsed; nothing is guessed by regular expressions.
//!
//! Parsing is bounded: at most [`MAX_PARSE`] bytes (cut at a line end) are parsed, the walk
//! descends a fixed number of levels (items, members, nested modules) with an explicit bound,
//! and at most [`MAX_ITEMS`] definitions are kept. Other languages get line counts and a head
//! excerpt.

use tree_sitter::{Language, Node, Parser};

use crate::summary::{DETAIL, KEY, MINOR, Summary};
use crate::util::{
    bytes as size, collapse, count, countu, line_count, line_prefix, plural, truncate,
};

/// Most bytes handed to the parser. tree-sitter parses valid Rust at about 3-4 MB/s on one
/// core with about 50 bytes of tree per source byte, so 512 KiB (some 15,000 lines, more
/// definitions than a summary lists) bounds a parse to about 0.15 s and 30 MB.
pub(crate) const MAX_PARSE: usize = 512 * 1024;
/// Code longer than this is first parsed up to here, and further (to [`MAX_PARSE`]) only when
/// that prefix is (nearly) free of syntax errors: tree-sitter's error recovery costs up to 8 s
/// per MB of text in the wrong language or of garbage (Python, TypeScript), against 0.1-0.3 s
/// per MB of valid code.
pub(crate) const PROBE: usize = 32 * 1024;
/// Most definitions kept.
const MAX_ITEMS: usize = 2_000;
/// Most characters of a signature.
const SIG_CHARS: usize = 200;
/// Deepest nesting of modules / classes walked.
const MAX_NEST: usize = 3;

/// The grammar for a language name, if built in.
pub(crate) fn grammar(language: &str) -> Option<Language> {
    Some(match language {
        "rust" => tree_sitter_rust::LANGUAGE.into(),
        "python" => tree_sitter_python::LANGUAGE.into(),
        "typescript" => tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
        "tsx" => tree_sitter_typescript::LANGUAGE_TSX.into(),
        "javascript" => tree_sitter_javascript::LANGUAGE.into(),
        "go" => tree_sitter_go::LANGUAGE.into(),
        "elixir" => tree_sitter_elixir::LANGUAGE.into(),
        _ => return None,
    })
}

/// One definition found.
#[derive(Debug, Clone)]
struct Item {
    /// 1-based line in the file.
    line: usize,
    /// 0 for top level, 1 for members, ...
    depth: usize,
    /// What it is: "function", "struct", "class", "method", ...
    kind: &'static str,
    /// The signature.
    text: String,
    /// Elixir: name/arity, to fold consecutive clauses of one function.
    key: Option<String>,
    clauses: usize,
}

/// What the walk collects.
struct Outline<'s> {
    src: &'s str,
    first_line: usize,
    imports: Vec<String>,
    items: Vec<Item>,
    notes: Vec<String>,
}

impl<'s> Outline<'s> {
    fn text(&self, node: Node) -> &'s str {
        self.src.get(node.byte_range()).unwrap_or("")
    }

    fn line(&self, node: Node) -> usize {
        node.start_position().row + self.first_line
    }

    /// The node's text up to the start of `stop` (its body), collapsed.
    fn head_until(&self, node: Node, stop: Option<Node>) -> String {
        let end = stop.map_or(node.end_byte(), |b| b.start_byte());
        let text = self.src.get(node.start_byte()..end).unwrap_or("");
        let mut out = collapse(crate::util::prefix(text, 4 * SIG_CHARS), SIG_CHARS);
        while out.ends_with('{') || out.ends_with(':') || out.ends_with(';') || out.ends_with('=') {
            out.pop();
            out = out.trim_end().to_string();
        }
        out
    }

    /// The node's text up to its `body` field.
    fn head(&self, node: Node) -> String {
        self.head_until(node, node.child_by_field_name("body"))
    }

    fn push(&mut self, node: Node, depth: usize, kind: &'static str, text: String) {
        self.push_keyed(node, depth, kind, text, None);
    }

    fn push_keyed(
        &mut self,
        node: Node,
        depth: usize,
        kind: &'static str,
        text: String,
        key: Option<String>,
    ) {
        if text.is_empty() {
            return;
        }
        if let (Some(k), Some(last)) = (&key, self.items.last_mut())
            && last.depth == depth
            && last.key.as_ref() == Some(k)
        {
            last.clauses += 1;
            return;
        }
        if self.items.len() >= MAX_ITEMS {
            return;
        }
        let line = self.line(node);
        self.items.push(Item {
            line,
            depth,
            kind,
            text,
            key,
            clauses: 1,
        });
    }

    fn import(&mut self, text: String) {
        if self.imports.len() < 500 && !text.is_empty() {
            self.imports.push(text);
        }
    }
}

/// The named children of `node`, with the children of ERROR nodes in their place: error
/// recovery wraps what it could not fit (a fragment of a file, an unbalanced `end`) in ERROR
/// nodes whose children are still well-formed definitions.
fn named_children(node: Node) -> Vec<Node> {
    fn direct(n: Node) -> Vec<Node> {
        let mut cursor = n.walk();
        n.named_children(&mut cursor).collect()
    }
    let mut out = Vec::new();
    // In order: a stack of the children still to visit, the next one on top.
    let mut stack: Vec<Node> = direct(node);
    stack.reverse();
    let mut expanded = 0usize;
    while let Some(n) = stack.pop() {
        if n.is_error() && expanded < 10_000 {
            expanded += 1;
            let mut kids = direct(n);
            kids.reverse();
            stack.extend(kids);
        } else {
            out.push(n);
        }
    }
    out
}

fn field<'t>(node: Node<'t>, name: &str) -> Option<Node<'t>> {
    node.child_by_field_name(name)
}

// ---------------------------------------------------------------------------------------------
// Rust

fn rust_items(o: &mut Outline, node: Node, depth: usize, member: bool) {
    for child in named_children(node) {
        match child.kind() {
            "use_declaration" | "extern_crate_declaration" => {
                let t = collapse(o.text(child), 160);
                let t = t.strip_prefix("pub ").unwrap_or(&t);
                let t = t.strip_prefix("use ").unwrap_or(t);
                o.import(t.trim_end_matches(';').to_string());
            }
            "function_item" | "function_signature_item" => {
                let kind = if member { "method" } else { "function" };
                let h = o.head(child);
                o.push(child, depth, kind, h);
            }
            "struct_item" | "union_item" => {
                let h = rust_struct(o, child);
                o.push(child, depth, "struct", h);
            }
            "enum_item" => {
                let h = rust_enum(o, child);
                o.push(child, depth, "enum", h);
            }
            "trait_item" | "impl_item" => {
                let kind = if child.kind() == "trait_item" {
                    "trait"
                } else {
                    "impl"
                };
                let h = o.head(child);
                o.push(child, depth, kind, h);
                if let Some(body) = field(child, "body") {
                    rust_items(o, body, depth + 1, true);
                }
            }
            "mod_item" => {
                let h = o.head(child);
                o.push(child, depth, "module", h);
                if let (Some(body), true) = (field(child, "body"), depth < MAX_NEST) {
                    rust_items(o, body, depth + 1, false);
                }
            }
            "foreign_mod_item" => {
                if let Some(body) = field(child, "body") {
                    rust_items(o, body, depth, false);
                }
            }
            "const_item" | "static_item" => {
                let h = o.head_until(child, field(child, "value"));
                o.push(child, depth, "const", h);
            }
            "type_item" | "associated_type" => {
                let h = o.head_until(child, None);
                o.push(child, depth, "type", h);
            }
            "macro_definition" => {
                let name = field(child, "name").map_or(String::new(), |n| collapse(o.text(n), 80));
                o.push(child, depth, "macro", format!("macro_rules! {name}"));
            }
            _ => {}
        }
    }
}

fn rust_struct(o: &Outline, node: Node) -> String {
    let Some(body) = field(node, "body") else {
        return o.head_until(node, None);
    };
    let head = o.head_until(node, Some(body));
    if body.kind() != "field_declaration_list" {
        // Tuple struct: the field types are the signature.
        return truncate(
            &format!("{head}{}", collapse(o.text(body), SIG_CHARS)),
            SIG_CHARS * 2,
        );
    }
    let fields: Vec<String> = named_children(body)
        .into_iter()
        .filter(|f| f.kind() == "field_declaration")
        .map(|f| collapse(o.text(f), 80))
        .collect();
    let full = format!("{head} {{ {} }}", fields.join(", "));
    if full.chars().count() <= SIG_CHARS * 2 {
        return full;
    }
    let names: Vec<String> = named_children(body)
        .into_iter()
        .filter(|f| f.kind() == "field_declaration")
        .filter_map(|f| field(f, "name").map(|n| collapse(o.text(n), 40)))
        .collect();
    truncate(&format!("{head} {{ {} }}", names.join(", ")), SIG_CHARS * 2)
}

fn rust_enum(o: &Outline, node: Node) -> String {
    let Some(body) = field(node, "body") else {
        return o.head_until(node, None);
    };
    let head = o.head_until(node, Some(body));
    let variants: Vec<String> = named_children(body)
        .into_iter()
        .filter(|v| v.kind() == "enum_variant")
        .map(|v| {
            let name = field(v, "name").map_or(String::new(), |n| collapse(o.text(n), 40));
            match field(v, "body").map(|b| b.kind()) {
                Some("ordered_field_declaration_list") => format!("{name}(..)"),
                Some("field_declaration_list") => format!("{name} {{ .. }}"),
                _ => name.to_string(),
            }
        })
        .collect();
    truncate(
        &format!("{head} {{ {} }}", variants.join(", ")),
        SIG_CHARS * 2,
    )
}

// ---------------------------------------------------------------------------------------------
// Python

fn python_items(o: &mut Outline, node: Node, depth: usize, decorators: &str) {
    for child in named_children(node) {
        python_item(o, child, depth, decorators);
    }
}

fn python_item(o: &mut Outline, child: Node, depth: usize, decorators: &str) {
    match child.kind() {
        "import_statement" | "import_from_statement" | "future_import_statement" => {
            o.import(collapse(o.text(child), 160));
        }
        "function_definition" => {
            let kind = if depth > 0 { "method" } else { "function" };
            let h = format!("{decorators}{}", o.head(child));
            o.push(child, depth, kind, h);
        }
        "class_definition" => {
            let h = format!("{decorators}{}", o.head(child));
            o.push(child, depth, "class", h);
            if let (Some(body), true) = (field(child, "body"), depth < MAX_NEST) {
                let mut fields = 0;
                for member in named_children(body) {
                    if member.kind() == "expression_statement" {
                        // Class attributes with annotations or values (dataclass fields, enums).
                        if fields < 30
                            && let Some(t) = python_assignment(o, member)
                        {
                            o.push(member, depth + 1, "field", t);
                            fields += 1;
                        }
                    } else {
                        python_item(o, member, depth + 1, "");
                    }
                }
            }
        }
        "decorated_definition" => {
            let decos: Vec<String> = named_children(child)
                .into_iter()
                .filter(|d| d.kind() == "decorator")
                .map(|d| collapse(o.text(d), 60))
                .collect();
            let prefix = if decos.is_empty() {
                String::new()
            } else {
                format!("{} ", decos.join(" "))
            };
            if let Some(def) = field(child, "definition") {
                python_item(o, def, depth, &prefix);
            }
        }
        "expression_statement" if depth == 0 => {
            if let Some(t) = python_assignment(o, child) {
                let is_const = t.split([' ', ':', '=']).next().is_some_and(|n| {
                    n.chars().any(|c| c.is_ascii_uppercase())
                        && !n.chars().any(|c| c.is_ascii_lowercase())
                });
                if is_const || t.contains(':') {
                    o.push(child, depth, "const", t);
                }
            }
        }
        "if_statement" if depth == 0 => {
            let cond = field(child, "condition").map_or("", |c| o.text(c));
            if cond.contains("__name__") {
                o.notes
                    .push("Has an `if __name__ == \"__main__\":` block.".into());
            }
        }
        _ => {}
    }
}

/// "NAME = value" / "name: Type = value" for an assignment statement, value kept short.
fn python_assignment(o: &Outline, stmt: Node) -> Option<String> {
    let a = named_children(stmt).into_iter().next()?;
    if a.kind() != "assignment" {
        return None;
    }
    let left = field(a, "left")?;
    if left.kind() != "identifier" {
        return None;
    }
    let mut t = o.text(left).to_string();
    if let Some(ty) = field(a, "type") {
        t.push_str(&format!(": {}", collapse(o.text(ty), 60)));
    }
    if let Some(right) = field(a, "right") {
        let v = collapse(o.text(right), 40);
        t.push_str(&format!(" = {v}"));
    }
    Some(t)
}

// ---------------------------------------------------------------------------------------------
// JavaScript / TypeScript

fn js_items(o: &mut Outline, node: Node, depth: usize) {
    for child in named_children(node) {
        js_item(o, child, depth, "");
    }
}

fn js_item(o: &mut Outline, child: Node, depth: usize, prefix: &str) {
    match child.kind() {
        "import_statement" => {
            let t = collapse(o.text(child), 160);
            let t = t.strip_prefix("import ").unwrap_or(&t);
            o.import(t.trim_end_matches(';').to_string());
        }
        "export_statement" => {
            let default = named_children(child).is_empty()
                || o.text(child)
                    .trim_start_matches("export")
                    .trim_start()
                    .starts_with("default");
            let p = if default {
                "export default "
            } else {
                "export "
            };
            if let Some(decl) = field(child, "declaration") {
                js_item(o, decl, depth, p);
            } else if let Some(value) = field(child, "value") {
                match value.kind() {
                    "function_expression" | "function" | "class" | "arrow_function" => {
                        js_item(o, value, depth, p)
                    }
                    _ => {
                        let t = collapse(o.text(child), 120);
                        o.push(child, depth, "export", t.trim_end_matches(';').to_string());
                    }
                }
            } else {
                let t = collapse(o.text(child), 160);
                o.push(child, depth, "export", t.trim_end_matches(';').to_string());
            }
        }
        "function_declaration"
        | "generator_function_declaration"
        | "function_expression"
        | "function" => {
            let h = format!("{prefix}{}", o.head(child));
            o.push(child, depth, "function", h);
        }
        "function_signature" => {
            let h = format!("{prefix}{}", o.head_until(child, None));
            o.push(child, depth, "function", h);
        }
        "class_declaration" | "abstract_class_declaration" | "class" => {
            let h = format!("{prefix}{}", o.head(child));
            o.push(child, depth, "class", h);
            if let Some(body) = field(child, "body") {
                for m in named_children(body) {
                    match m.kind() {
                        "method_definition" => {
                            let h = o.head(m);
                            o.push(m, depth + 1, "method", h);
                        }
                        "method_signature" | "abstract_method_signature" | "index_signature" => {
                            let h = o.head_until(m, None);
                            o.push(m, depth + 1, "method", h);
                        }
                        "public_field_definition" | "field_definition" => {
                            let h = o.head_until(m, field(m, "value"));
                            o.push(m, depth + 1, "field", h);
                        }
                        _ => {}
                    }
                }
            }
        }
        "lexical_declaration" | "variable_declaration" => {
            let declarators: Vec<Node> = named_children(child)
                .into_iter()
                .filter(|d| d.kind() == "variable_declarator")
                .collect();
            let keyword = o
                .head_until(child, declarators.first().copied())
                .trim()
                .to_string();
            for d in declarators {
                js_declarator(o, d, depth, &format!("{prefix}{keyword} "));
            }
        }
        "interface_declaration" => {
            let h = format!("{prefix}{}", o.head(child));
            o.push(child, depth, "interface", h);
            if let Some(body) = field(child, "body") {
                for m in named_children(body).into_iter().take(40) {
                    if m.kind().ends_with("signature") {
                        let t = collapse(o.text(m), SIG_CHARS);
                        o.push(
                            m,
                            depth + 1,
                            "member",
                            t.trim_end_matches([';', ',']).to_string(),
                        );
                    }
                }
            }
        }
        "type_alias_declaration" => {
            let t = format!("{prefix}{}", collapse(o.text(child), SIG_CHARS));
            o.push(child, depth, "type", t.trim_end_matches(';').to_string());
        }
        "enum_declaration" => {
            let head = o.head(child);
            let members: Vec<String> = field(child, "body")
                .map(|b| {
                    named_children(b)
                        .into_iter()
                        .take(40)
                        .map(|m| {
                            let n = field(m, "name").unwrap_or(m);
                            collapse(o.text(n), 40)
                        })
                        .collect()
                })
                .unwrap_or_default();
            o.push(
                child,
                depth,
                "enum",
                truncate(
                    &format!("{prefix}{head} {{ {} }}", members.join(", ")),
                    SIG_CHARS * 2,
                ),
            );
        }
        "internal_module" | "module" => {
            let h = format!("{prefix}{}", o.head(child));
            o.push(child, depth, "namespace", h);
            if let (Some(body), true) = (field(child, "body"), depth < MAX_NEST) {
                js_items(o, body, depth + 1);
            }
        }
        "ambient_declaration" => {
            for c in named_children(child) {
                js_item(o, c, depth, &format!("{prefix}declare "));
            }
        }
        "expression_statement" => {
            let Some(e) = named_children(child).into_iter().next() else {
                return;
            };
            // TypeScript parses `namespace X { … }` as an expression statement.
            if e.kind() == "internal_module" {
                js_item(o, e, depth, prefix);
                return;
            }
            if e.kind() != "assignment_expression" || depth > 0 {
                return;
            }
            let (Some(left), Some(right)) = (field(e, "left"), field(e, "right")) else {
                return;
            };
            let name = collapse(o.text(left), 80);
            let t = js_value_sig(o, &format!("{name} ="), right);
            o.push(child, depth, "assignment", t);
        }
        _ => {}
    }
}

/// `const name = …` with the value described: a function's parameters and return type, an
/// object's keys, a `require`, or a short literal.
fn js_declarator(o: &mut Outline, d: Node, depth: usize, keyword: &str) {
    let name = field(d, "name").map_or(String::new(), |n| collapse(o.text(n), 80));
    let ty = field(d, "type").map_or(String::new(), |t| collapse(o.text(t), 60));
    let Some(value) = field(d, "value") else {
        o.push(d, depth, "variable", format!("{keyword}{name}{ty}"));
        return;
    };
    if value.kind() == "call_expression" {
        let callee = field(value, "function").map_or("", |f| o.text(f));
        if callee == "require" {
            let arg = field(value, "arguments").map_or("", |a| o.text(a));
            o.import(format!("{name} = require{}", collapse(arg, 100)));
            return;
        }
    }
    if value.kind() == "class" {
        let h = format!("{keyword}{name} = {}", o.head(value));
        o.push(d, depth, "class", h);
        return;
    }
    let kind = if is_function(value) {
        "function"
    } else {
        "variable"
    };
    let t = js_value_sig(o, &format!("{keyword}{name}{ty} ="), value);
    o.push(d, depth, kind, t);
}

fn is_function(n: Node) -> bool {
    matches!(
        n.kind(),
        "arrow_function" | "function_expression" | "function" | "generator_function"
    )
}

/// `left` followed by a description of the value node.
fn js_value_sig(o: &Outline, left: &str, value: Node) -> String {
    if is_function(value) {
        let head = o.head(value);
        let arrow = if value.kind() == "arrow_function" {
            " =>"
        } else {
            ""
        };
        let head = head.trim_end_matches("=>").trim_end();
        return truncate(&format!("{left} {head}{arrow} …"), SIG_CHARS * 2);
    }
    if value.kind() == "object" {
        let keys: Vec<String> = named_children(value)
            .into_iter()
            .take(16)
            .filter_map(|p| match p.kind() {
                "pair" => {
                    let k = field(p, "key").map_or("", |k| o.text(k));
                    let fun = field(p, "value").is_some_and(is_function);
                    Some(format!(
                        "{}{}",
                        collapse(k, 40),
                        if fun { "()" } else { "" }
                    ))
                }
                "method_definition" => {
                    field(p, "name").map(|n| format!("{}()", collapse(o.text(n), 40)))
                }
                "shorthand_property_identifier" => Some(o.text(p).to_string()),
                _ => None,
            })
            .collect();
        if keys.is_empty() {
            return format!("{left} {{}}");
        }
        let more = if named_children(value).len() > 16 {
            ", …"
        } else {
            ""
        };
        return truncate(
            &format!("{left} {{ {}{more} }}", keys.join(", ")),
            SIG_CHARS * 2,
        );
    }
    format!("{left} {}", collapse(o.text(value), 60))
}

// ---------------------------------------------------------------------------------------------
// Go

fn go_items(o: &mut Outline, node: Node) {
    for child in named_children(node) {
        match child.kind() {
            "package_clause" => o.notes.push(format!("{}.", collapse(o.text(child), 80))),
            "import_declaration" => {
                let mut stack = vec![child];
                while let Some(n) = stack.pop() {
                    if n.kind() == "import_spec" {
                        o.import(collapse(o.text(n), 120));
                    } else {
                        let mut kids = named_children(n);
                        kids.reverse();
                        stack.extend(kids);
                    }
                }
            }
            "function_declaration" | "method_declaration" => {
                let kind = if child.kind() == "method_declaration" {
                    "method"
                } else {
                    "function"
                };
                let h = o.head(child);
                o.push(child, 0, kind, h);
            }
            "type_declaration" => {
                for spec in named_children(child) {
                    if !matches!(spec.kind(), "type_spec" | "type_alias") {
                        continue;
                    }
                    let name =
                        field(spec, "name").map_or(String::new(), |n| collapse(o.text(n), 80));
                    let ty = field(spec, "type");
                    match ty.map(|t| t.kind()) {
                        Some("struct_type") => {
                            let fields: Vec<String> = ty
                                .and_then(|t| named_children(t).into_iter().next())
                                .map(|list| {
                                    named_children(list)
                                        .into_iter()
                                        .filter(|f| f.kind() == "field_declaration")
                                        .map(|f| collapse(o.text(f), 60))
                                        .collect()
                                })
                                .unwrap_or_default();
                            o.push(
                                spec,
                                0,
                                "struct",
                                truncate(
                                    &format!("type {name} struct {{ {} }}", fields.join("; ")),
                                    SIG_CHARS * 2,
                                ),
                            );
                        }
                        Some("interface_type") => {
                            o.push(spec, 0, "interface", format!("type {name} interface"));
                            if let Some(t) = ty {
                                for m in named_children(t).into_iter().take(40) {
                                    if matches!(m.kind(), "method_elem" | "method_spec") {
                                        o.push(m, 1, "method", collapse(o.text(m), SIG_CHARS));
                                    }
                                }
                            }
                        }
                        _ => o.push(
                            spec,
                            0,
                            "type",
                            format!("type {}", collapse(o.text(spec), SIG_CHARS)),
                        ),
                    }
                }
            }
            "const_declaration" | "var_declaration" => {
                let kw = if child.kind() == "const_declaration" {
                    "const"
                } else {
                    "var"
                };
                let names: Vec<String> = named_children(child)
                    .into_iter()
                    .filter_map(|s| field(s, "name").map(|n| collapse(o.text(n), 40)))
                    .take(30)
                    .collect();
                if !names.is_empty() {
                    o.push(child, 0, "const", format!("{kw} {}", names.join(", ")));
                }
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Elixir

fn elixir_items(o: &mut Outline, node: Node, depth: usize) {
    for child in named_children(node) {
        if child.kind() != "call" {
            continue;
        }
        let target = field(child, "target").map_or("", |t| o.text(t));
        let args = named_children(child)
            .into_iter()
            .find(|n| n.kind() == "arguments");
        let first_arg = args.and_then(|a| named_children(a).into_iter().next());
        let do_block = named_children(child)
            .into_iter()
            .find(|n| n.kind() == "do_block");
        match target {
            "defmodule" | "defprotocol" | "defimpl" => {
                let name = first_arg.map_or(String::new(), |a| collapse(o.text(a), 100));
                o.push(child, depth, "module", format!("{target} {name}"));
                if let (Some(body), true) = (do_block, depth < MAX_NEST) {
                    elixir_items(o, body, depth + 1);
                }
            }
            "def" | "defp" | "defmacro" | "defmacrop" | "defguard" | "defguardp" | "defn"
            | "defnp" | "defdelegate" => {
                let Some(head) = first_arg else { continue };
                // `def name(args) when guard`: the call is the left operand.
                let call = if head.kind() == "binary_operator" {
                    field(head, "left").unwrap_or(head)
                } else {
                    head
                };
                let (name, arity) = if call.kind() == "call" {
                    let n = field(call, "target").map_or("", |t| o.text(t));
                    let a = named_children(call)
                        .into_iter()
                        .find(|n| n.kind() == "arguments")
                        .map_or(0, |a| a.named_child_count());
                    (n.to_string(), a)
                } else {
                    (o.text(call).to_string(), 0)
                };
                let sig = format!("{target} {}", collapse(o.text(head), SIG_CHARS));
                let kind = if target.starts_with("defmacro") {
                    "macro"
                } else {
                    "function"
                };
                o.push_keyed(
                    child,
                    depth,
                    kind,
                    sig,
                    Some(format!("{target} {name}/{arity}")),
                );
            }
            "use" | "import" | "alias" | "require" => {
                o.import(collapse(
                    &format!("{target} {}", args.map_or("", |a| o.text(a))),
                    160,
                ));
            }
            "defstruct" | "defexception" => {
                let t = collapse(o.text(child), SIG_CHARS);
                o.push(child, depth, "struct", t);
            }
            "describe" | "schema" | "embedded_schema" | "scope" | "pipeline" => {
                let t = format!(
                    "{target} {}",
                    args.map_or(String::new(), |a| collapse(o.text(a), 100))
                );
                o.push(child, depth, "block", t.trim_end().to_string());
                if let (Some(body), true) = (do_block, depth < MAX_NEST + 1) {
                    elixir_items(o, body, depth + 1);
                }
            }
            "test" => {
                let t = format!(
                    "test {}",
                    first_arg.map_or(String::new(), |a| collapse(o.text(a), 120))
                );
                o.push(child, depth, "test", t);
            }
            // Other calls with a do-block inside a module: DSL sections (Ash `attributes do`,
            // Ecto `schema`, Phoenix `scope`), named but not entered.
            t if depth > 0 && do_block.is_some() && !t.is_empty() => {
                let a = args.map_or(String::new(), |a| collapse(o.text(a), 80));
                o.push(
                    child,
                    depth,
                    "block",
                    format!("{t} {a}").trim_end().to_string(),
                );
            }
            "config" if depth == 0 => {
                let a: Vec<String> = args
                    .map(|a| {
                        named_children(a)
                            .into_iter()
                            .take(2)
                            .map(|n| collapse(o.text(n), 60))
                            .collect()
                    })
                    .unwrap_or_default();
                o.push(child, depth, "config", format!("config {}", a.join(", ")));
            }
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------------------------

/// The summary of source code in `language`.
pub(crate) fn explore(text: &str, language: &str, first_line: usize) -> Summary {
    let lines = line_count(text.as_bytes());
    let head = format!(
        "Code ({language}): {} line{}, {}",
        countu(lines),
        plural(lines as u64),
        size(text.len())
    );
    let Some(lang) = grammar(language) else {
        return generic(text, head, language);
    };
    let mut parser = Parser::new();
    if parser.set_language(&lang).is_err() {
        return generic(text, head, language);
    }
    let probe = line_prefix(text, PROBE);
    let Some(mut tree) = parser.parse(probe, None) else {
        return generic(text, head, language);
    };
    let mut src = probe;
    let (errors, error_bytes) = error_stats(tree.root_node());
    // More than one error region per KiB, or more than 5% of the text in errors.
    let garbled = errors * 1024 > probe.len() || error_bytes * 20 > probe.len();
    if probe.len() < text.len() && !garbled {
        let full = line_prefix(text, MAX_PARSE);
        match parser.parse(full, None) {
            Some(t) => {
                tree = t;
                src = full;
            }
            None => return generic(text, head, language),
        }
    }
    let root = tree.root_node();
    let mut o = Outline {
        src,
        first_line,
        imports: Vec::new(),
        items: Vec::new(),
        notes: Vec::new(),
    };
    match language {
        "rust" => rust_items(&mut o, root, 0, false),
        "python" => python_items(&mut o, root, 0, ""),
        "typescript" | "tsx" | "javascript" => js_items(&mut o, root, 0),
        "go" => go_items(&mut o, root),
        "elixir" => elixir_items(&mut o, root, 0),
        _ => {}
    }

    // "12 functions, 3 structs" over the top level, then members.
    let mut kinds: Vec<(&str, u64)> = Vec::new();
    for item in o.items.iter() {
        let label = item.kind;
        match kinds.iter_mut().find(|k| k.0 == label) {
            Some(k) => k.1 += 1,
            None => kinds.push((label, 1)),
        }
    }
    let mut head = head;
    if !kinds.is_empty() {
        let list: Vec<String> = kinds
            .iter()
            .map(|(k, n)| format!("{} {}", count(*n), plural_kind(k, *n)))
            .collect();
        head.push_str(&format!("; {}", list.join(", ")));
    }
    let mut s = Summary::new(head);
    if src.len() < text.len() {
        s.push(
            KEY,
            format!(
                "Structure from the first {} ({} lines){}; the rest was not parsed.",
                size(src.len()),
                countu(line_count(src.as_bytes())),
                if garbled {
                    ", which has syntax errors"
                } else {
                    ""
                }
            ),
        );
    }
    if root.has_error() {
        s.push(
            MINOR,
            "The parser met syntax errors (a fragment, or another dialect): the outline may be incomplete.",
        );
    }
    for note in &o.notes {
        s.push(DETAIL, note.clone());
    }
    if !o.imports.is_empty() {
        let list = o.imports.join("; ");
        s.push(
            DETAIL,
            format!(
                "Imports ({}): {}",
                countu(o.imports.len()),
                truncate(&list, 1500)
            ),
        );
    }
    if !o.items.is_empty() {
        s.heading(KEY, "Definitions:");
    }
    for item in &o.items {
        let rank = match (item.depth, item.kind) {
            (0, "const" | "variable" | "config" | "export" | "type") => DETAIL,
            (0, _) => KEY,
            (1, _) => DETAIL,
            _ => MINOR,
        };
        let clauses = if item.clauses > 1 {
            format!(" ({} clauses)", item.clauses)
        } else {
            String::new()
        };
        s.push(
            rank,
            format!(
                "{}L{} {}{clauses}",
                "  ".repeat(item.depth + 1),
                item.line,
                item.text
            ),
        );
    }
    if o.items.len() >= MAX_ITEMS {
        s.push(
            MINOR,
            format!("  … definitions after the first {MAX_ITEMS} not listed"),
        );
    }
    if o.items.is_empty() {
        excerpt(text, &mut s);
    }
    s
}

/// Outermost ERROR and MISSING nodes: how many, and the bytes the ERROR nodes cover.
fn error_stats(root: Node) -> (usize, usize) {
    if !root.has_error() {
        return (0, 0);
    }
    let (mut count, mut bytes) = (0usize, 0usize);
    let mut cursor = root.walk();
    // Pre-order walk with the cursor (no recursion); subtrees without errors are skipped.
    loop {
        let node = cursor.node();
        let descend = if node.is_error() || node.is_missing() {
            count += 1;
            bytes += node.byte_range().len();
            false
        } else {
            node.has_error()
        };
        if descend && cursor.goto_first_child() {
            continue;
        }
        loop {
            if cursor.goto_next_sibling() {
                break;
            }
            if !cursor.goto_parent() {
                return (count, bytes);
            }
        }
    }
}

fn plural_kind(kind: &str, n: u64) -> String {
    if n == 1 {
        return kind.to_string();
    }
    match kind {
        "class" => "classes".into(),
        "config" => "config calls".into(),
        k => format!("{k}s"),
    }
}

/// Head excerpt for code without structure.
fn excerpt(text: &str, s: &mut Summary) {
    s.heading(DETAIL, "Head:");
    for line in text.lines().take(20) {
        s.push(DETAIL, format!("  {}", truncate(line, 160)));
    }
}

/// Code in a language without a built-in grammar.
fn generic(text: &str, head: String, language: &str) -> Summary {
    let mut s = Summary::new(head);
    s.push(
        KEY,
        format!("No structural parser for {language}: head of the file below."),
    );
    excerpt(text, &mut s);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outline(src: &str, lang: &str) -> String {
        explore(src, lang, 1).text()
    }

    #[test]
    fn all_grammars_load() {
        for l in [
            "rust",
            "python",
            "typescript",
            "tsx",
            "javascript",
            "go",
            "elixir",
        ] {
            let mut p = Parser::new();
            p.set_language(&grammar(l).unwrap()).unwrap();
        }
    }

    #[test]
    fn rust_outline() {
        let src = r#"
use std::collections::HashMap;
use serde::{Deserialize, Serialize};

/// A thing.
#[derive(Debug)]
pub struct Point<T> {
    pub x: T,
    y: T,
}

pub struct Wrapper(u32, String);

pub enum Shape { Circle(f64), Square { side: f64 }, Empty }

pub trait Area {
    fn area(&self) -> f64;
    fn name(&self) -> String { "shape".into() }
}

impl<T: Copy> Point<T> {
    pub fn new(x: T, y: T) -> Self { Point { x, y } }
}

pub const MAX: usize = 10;
static NAME: &str = "x";
type Map = HashMap<String, u32>;

pub async fn fetch(url: &str, retries: u32) -> Result<Vec<u8>, Error> {
    todo!()
}

mod inner {
    pub fn helper() {}
}

macro_rules! square { ($x:expr) => { $x * $x }; }
"#;
        let t = outline(src, "rust");
        assert!(
            t.contains("Imports (2): std::collections::HashMap; serde::{Deserialize, Serialize}"),
            "{t}"
        );
        assert!(
            t.contains("L7 pub struct Point<T> { pub x: T, y: T }"),
            "{t}"
        );
        assert!(t.contains("pub struct Wrapper(u32, String)"), "{t}");
        assert!(
            t.contains("pub enum Shape { Circle(..), Square { .. }, Empty }"),
            "{t}"
        );
        assert!(t.contains("L16 pub trait Area"), "{t}");
        assert!(t.contains("    L17 fn area(&self) -> f64"), "{t}");
        assert!(t.contains("    L18 fn name(&self) -> String"), "{t}");
        assert!(t.contains("L21 impl<T: Copy> Point<T>"), "{t}");
        assert!(t.contains("    L22 pub fn new(x: T, y: T) -> Self"), "{t}");
        assert!(t.contains("pub const MAX: usize"), "{t}");
        assert!(t.contains("static NAME: &str"), "{t}");
        assert!(t.contains("type Map = HashMap<String, u32>"), "{t}");
        assert!(
            t.contains("pub async fn fetch(url: &str, retries: u32) -> Result<Vec<u8>, Error>"),
            "{t}"
        );
        assert!(t.contains("mod inner"), "{t}");
        assert!(t.contains("    L34 pub fn helper()"), "{t}");
        assert!(t.contains("macro_rules! square"), "{t}");
        assert!(t.starts_with("Code (rust): 37 lines"), "{t}");
    }

    #[test]
    fn python_outline() {
        let src = r#"#!/usr/bin/env python3
import os
from typing import List, Optional

MAX_RETRIES = 3
log = None

@dataclass(frozen=True)
class User(Base):
    name: str
    age: int = 0

    def greet(self, other: "User") -> str:
        return f"hi {other.name}"

    @property
    def adult(self) -> bool:
        return self.age >= 18

async def fetch(url: str, *, timeout: float = 1.0) -> Optional[bytes]:
    pass

def main():
    pass

if __name__ == "__main__":
    main()
"#;
        let t = outline(src, "python");
        assert!(
            t.contains("Imports (2): import os; from typing import List, Optional"),
            "{t}"
        );
        assert!(t.contains("L5 MAX_RETRIES = 3"), "{t}");
        assert!(!t.contains("log = None"), "{t}");
        assert!(
            t.contains("L9 @dataclass(frozen=True) class User(Base)"),
            "{t}"
        );
        assert!(t.contains("    L10 name: str"), "{t}");
        assert!(
            t.contains("    L13 def greet(self, other: \"User\") -> str"),
            "{t}"
        );
        assert!(
            t.contains("    L17 @property def adult(self) -> bool"),
            "{t}"
        );
        assert!(
            t.contains("async def fetch(url: str, *, timeout: float = 1.0) -> Optional[bytes]"),
            "{t}"
        );
        assert!(t.contains("L23 def main()"), "{t}");
        assert!(t.contains("__main__"), "{t}");
    }

    #[test]
    fn typescript_outline() {
        let src = r#"import { readFile } from "fs";
import * as path from "path";

export interface Options {
  verbose?: boolean;
  run(name: string): Promise<void>;
}

export type Id = string | number;

export enum Color { Red, Green = 2 }

export class Store<T> extends Base implements Iface {
  private items: T[] = [];
  constructor(private readonly name: string) { super(); }
  async get(id: Id): Promise<T | undefined> { return undefined; }
}

export function load(file: string, opts?: Options): Promise<string> {
  return readFile(file);
}

export const handler = async (req: Request): Promise<Response> => { return new Response(); };
const LIMIT: number = 10;
export default Store;
declare function ext(x: number): void;
namespace NS { export function inner(): void {} }
"#;
        let t = outline(src, "typescript");
        assert!(
            t.contains("Imports (2): { readFile } from \"fs\"; * as path from \"path\""),
            "{t}"
        );
        assert!(t.contains("L4 export interface Options"), "{t}");
        assert!(t.contains("    L5 verbose?: boolean"), "{t}");
        assert!(t.contains("    L6 run(name: string): Promise<void>"), "{t}");
        assert!(t.contains("export type Id = string | number"), "{t}");
        assert!(t.contains("export enum Color { Red, Green }"), "{t}");
        assert!(
            t.contains("L13 export class Store<T> extends Base implements Iface"),
            "{t}"
        );
        assert!(t.contains("    L14 private items: T[]"), "{t}");
        assert!(
            t.contains("constructor(private readonly name: string)"),
            "{t}"
        );
        assert!(
            t.contains("    L16 async get(id: Id): Promise<T | undefined>"),
            "{t}"
        );
        assert!(
            t.contains("L19 export function load(file: string, opts?: Options): Promise<string>"),
            "{t}"
        );
        assert!(
            t.contains("export const handler = async (req: Request): Promise<Response> => …"),
            "{t}"
        );
        assert!(t.contains("const LIMIT: number = 10"), "{t}");
        assert!(t.contains("export default Store"), "{t}");
        assert!(t.contains("declare function ext(x: number): void"), "{t}");
        assert!(t.contains("namespace NS"), "{t}");
        assert!(t.contains("export function inner(): void"), "{t}");
    }

    #[test]
    fn tsx_and_javascript_outline() {
        let tsx =
            "export function App({ name }: Props): JSX.Element {\n  return <div>{name}</div>;\n}\n";
        let t = outline(tsx, "tsx");
        assert!(
            t.contains("L1 export function App({ name }: Props): JSX.Element"),
            "{t}"
        );
        let js = r#"const fs = require("fs");
import { Socket } from "phoenix";
const Hooks = {};
Hooks.Terminal = {
  mounted() { this.x = 1; },
  destroyed() {},
  name: "t",
};
function start(a, b = 2) { return a + b; }
class Widget extends HTMLElement {
  connectedCallback() {}
}
module.exports = { start };
"#;
        let t = outline(js, "javascript");
        assert!(
            t.contains("Imports (2): fs = require(\"fs\"); { Socket } from \"phoenix\""),
            "{t}"
        );
        assert!(t.contains("L3 const Hooks = {}"), "{t}");
        assert!(
            t.contains("L4 Hooks.Terminal = { mounted(), destroyed(), name }"),
            "{t}"
        );
        assert!(t.contains("L9 function start(a, b = 2)"), "{t}");
        assert!(t.contains("L10 class Widget extends HTMLElement"), "{t}");
        assert!(t.contains("    L11 connectedCallback()"), "{t}");
        assert!(t.contains("module.exports = { start }"), "{t}");
    }

    #[test]
    fn go_outline() {
        let src = r#"package main

import (
	"fmt"
	"os"
)

type Server struct {
	Addr string
	port int
}

type Handler interface {
	Serve(w Writer, r *Request) error
}

const Version = "1.0"

func (s *Server) Start(ctx context.Context) error {
	return nil
}

func main() {
	fmt.Println(os.Args)
}
"#;
        let t = outline(src, "go");
        assert!(t.contains("package main."), "{t}");
        assert!(t.contains("Imports (2): \"fmt\"; \"os\""), "{t}");
        assert!(
            t.contains("type Server struct { Addr string; port int }"),
            "{t}"
        );
        assert!(t.contains("type Handler interface"), "{t}");
        assert!(t.contains("Serve(w Writer, r *Request) error"), "{t}");
        assert!(t.contains("const Version"), "{t}");
        assert!(
            t.contains("L19 func (s *Server) Start(ctx context.Context) error"),
            "{t}"
        );
        assert!(t.contains("L23 func main()"), "{t}");
    }

    #[test]
    fn elixir_outline() {
        let src = r#"defmodule MyApp.Worker do
  use GenServer
  alias MyApp.{Repo, User}

  defstruct [:id, :name]

  def start_link(opts \\ []) do
    GenServer.start_link(__MODULE__, opts)
  end

  def handle_call(:get, _from, state), do: {:reply, state, state}
  def handle_call({:put, v}, _from, _state), do: {:reply, :ok, v}

  defp helper(x) when is_integer(x) do
    x + 1
  end
end
"#;
        let t = outline(src, "elixir");
        assert!(t.contains("L1 defmodule MyApp.Worker"), "{t}");
        assert!(t.contains("use GenServer"), "{t}");
        assert!(t.contains("alias MyApp.{Repo, User}"), "{t}");
        assert!(t.contains("defstruct [:id, :name]"), "{t}");
        assert!(t.contains("    L7 def start_link(opts \\\\ [])"), "{t}");
        assert!(
            t.contains("def handle_call(:get, _from, state) (2 clauses)"),
            "{t}"
        );
        assert!(t.contains("defp helper(x) when is_integer(x)"), "{t}");
    }

    #[test]
    fn unknown_language_and_garbage() {
        let t = outline("int main() { return 0; }\n", "c");
        assert!(t.contains("No structural parser for c"), "{t}");
        assert!(t.contains("int main()"), "{t}");
        let t = outline("fn (((( {{{{ ]]]] \u{0}", "rust");
        assert!(t.starts_with("Code (rust): 1 line"), "{t}");
        let deep = format!("x = {}1{}\n", "(".repeat(50_000), ")".repeat(50_000));
        let t = outline(&deep, "python");
        assert!(t.starts_with("Code (python)"), "{t}");
    }

    #[test]
    fn fragments_keep_their_definitions() {
        // The middle of a module: an `end` too many puts everything in an ERROR node.
        let src = "    {:noreply, socket}\n  end\n\n  def handle_info(:tick, socket) do\n    {:noreply, socket}\n  end\nend\n";
        let t = explore(src, "elixir", 40).text();
        assert!(t.contains("L43 def handle_info(:tick, socket)"), "{t}");
    }

    #[test]
    fn long_garbled_input_is_parsed_up_to_the_probe() {
        let mut src = String::new();
        let mut i = 0u64;
        while src.len() < 3 * PROBE {
            src.push_str(&format!("def f{i}(: ) ]] {{ <<< x{i} >>> \n"));
            i += 1;
        }
        let t = explore(&src, "python", 1).text();
        assert!(
            t.contains("which has syntax errors; the rest was not parsed"),
            "{t}"
        );
        // Valid code longer than the probe is parsed further.
        let mut ok = String::new();
        let mut i = 0;
        while ok.len() < 3 * PROBE {
            ok.push_str(&format!("def f{i}(a, b):\n    return a + b\n\n"));
            i += 1;
        }
        let t = explore(&ok, "python", 1).text();
        assert!(!t.contains("not parsed"), "{t}");
        // Definitions past the probe (about 960 fit in it) are listed.
        assert!(i > 2_000 && t.contains("def f1999(a, b)"), "{t}");
    }

    #[test]
    fn line_numbers_follow_the_first_line() {
        let t = explore("fn a() {}\n\nfn b() {}\n", "rust", 260).text();
        assert!(t.contains("L260 fn a()"), "{t}");
        assert!(t.contains("L262 fn b()"), "{t}");
    }
}
