//! Lazy, order-preserving access to JSON text, shared by the transcript parsers.
//!
//! `serde_json::Value` (without the `preserve_order` feature) sorts object keys and normalises
//! numbers, so text rebuilt from it is not what the host wrote. The parsers instead walk the
//! input as [`RawValue`]s: each level is split into its fields or elements only when needed, and
//! any sub-value can be given back as its exact source text (see [`compact`] for the one-line
//! form used for tool-call arguments and opaque parts).
//!
//! Every accessor that can fail returns a [`ParseError::InvalidEntry`] naming the field's path
//! (`message.content[2].tool_use_id`) and what was wrong with it.

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use super::ParseError;

/// The JSON type of a value, for error messages and dispatch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Null,
    Bool,
    Number,
    String,
    Array,
    Object,
}

impl Kind {
    /// `a string`, `an array`, ... for messages like "must be an object, found a string".
    pub(crate) fn described(self) -> &'static str {
        match self {
            Kind::Null => "null",
            Kind::Bool => "a boolean",
            Kind::Number => "a number",
            Kind::String => "a string",
            Kind::Array => "an array",
            Kind::Object => "an object",
        }
    }
}

/// The type of a (valid) raw JSON value, read from its first byte.
pub(crate) fn kind(raw: &RawValue) -> Kind {
    match raw.get().as_bytes().first() {
        Some(b'n') => Kind::Null,
        Some(b't' | b'f') => Kind::Bool,
        Some(b'"') => Kind::String,
        Some(b'[') => Kind::Array,
        Some(b'{') => Kind::Object,
        _ => Kind::Number,
    }
}

/// The type of a parsed JSON value.
pub(crate) fn value_kind(value: &serde_json::Value) -> Kind {
    match value {
        serde_json::Value::Null => Kind::Null,
        serde_json::Value::Bool(_) => Kind::Bool,
        serde_json::Value::Number(_) => Kind::Number,
        serde_json::Value::String(_) => Kind::String,
        serde_json::Value::Array(_) => Kind::Array,
        serde_json::Value::Object(_) => Kind::Object,
    }
}

/// Parses one line as JSON without building a tree, reporting malformed JSON like
/// [`json_line`](super::json_line) does.
pub(crate) fn raw_line(text: &str, line: u64) -> Result<&RawValue, ParseError> {
    serde_json::from_str::<&RawValue>(text).map_err(|e| ParseError::MalformedJson {
        line,
        detail: e.to_string(),
    })
}

/// An [`ParseError::InvalidEntry`] for `line`.
pub(crate) fn invalid(line: u64, detail: impl Into<String>) -> ParseError {
    ParseError::InvalidEntry {
        line,
        detail: detail.into(),
    }
}

/// The value as a string, decoding escapes. `Err` says what was wrong.
pub(crate) fn as_string(raw: &RawValue) -> Result<String, String> {
    match kind(raw) {
        Kind::String => serde_json::from_str::<String>(raw.get())
            .map_err(|e| format!("is not a valid JSON string: {e}")),
        other => Err(format!("must be a string, found {}", other.described())),
    }
}

/// The elements of an array value.
pub(crate) fn as_array(raw: &RawValue) -> Option<Vec<&RawValue>> {
    match kind(raw) {
        Kind::Array => serde_json::from_str::<Vec<&RawValue>>(raw.get()).ok(),
        _ => None,
    }
}

/// The JSON text of a value on one line: the source text with whitespace between tokens removed.
/// Key order, number spelling and string escapes stay exactly as written.
pub(crate) fn compact(raw: &RawValue) -> String {
    let text = raw.get();
    let mut out = String::with_capacity(text.len());
    let mut in_string = false;
    let mut escaped = false;
    for c in text.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if c == '"' {
            in_string = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    out
}

/// The 1-based line of `text` on which `part` (a sub-slice of `text`) starts; 1 if `part` is not
/// inside `text`.
pub(crate) fn line_of(text: &str, part: &str) -> u64 {
    let offset = (part.as_ptr() as usize).wrapping_sub(text.as_ptr() as usize);
    match text.as_bytes().get(..offset) {
        Some(before) => 1 + before.iter().filter(|&&b| b == b'\n').count() as u64,
        None => 1,
    }
}

/// How many bytes base64 text decodes to (exact for well-formed, padded or unpadded base64;
/// whitespace inside the text is not counted).
pub(crate) fn base64_decoded_len(data: &str) -> u64 {
    let symbols = data
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'=')
        .count() as u64;
    symbols * 3 / 4
}

/// A JSON object being read, with the path it was found at (for error messages).
#[derive(Debug)]
pub(crate) struct Obj<'a> {
    raw: &'a RawValue,
    fields: BTreeMap<String, &'a RawValue>,
    /// `""` for the top level, else e.g. `message.content[2]`.
    path: String,
    line: u64,
}

impl<'a> Obj<'a> {
    /// Reads `raw` as an object; `what` names it in the error when it is not one
    /// (`a Claude Code entry`, `` `messages[3]` ``).
    pub(crate) fn parse(
        raw: &'a RawValue,
        path: String,
        line: u64,
        what: &str,
    ) -> Result<Self, ParseError> {
        let found = kind(raw);
        if found != Kind::Object {
            return Err(invalid(
                line,
                format!("{what} must be a JSON object, found {}", found.described()),
            ));
        }
        let fields = serde_json::from_str::<BTreeMap<String, &'a RawValue>>(raw.get())
            .map_err(|e| invalid(line, format!("{what} could not be read: {e}")))?;
        Ok(Obj {
            raw,
            fields,
            path,
            line,
        })
    }

    /// An element of an array found at `self.key`: path `key[index]`.
    pub(crate) fn element(
        &self,
        key: &str,
        index: usize,
        raw: &'a RawValue,
    ) -> Result<Obj<'a>, ParseError> {
        let path = format!("{}[{index}]", self.path_of(key));
        let what = format!("`{path}`");
        Obj::parse(raw, path, self.line, &what)
    }

    /// The path of a field of this object, as shown in errors.
    pub(crate) fn path_of(&self, key: &str) -> String {
        if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        }
    }

    /// The object's source text.
    pub(crate) fn raw(&self) -> &'a RawValue {
        self.raw
    }

    /// An error about the field `key`: "`path.key` {problem}".
    pub(crate) fn error(&self, key: &str, problem: &str) -> ParseError {
        invalid(self.line, format!("`{}` {problem}", self.path_of(key)))
    }

    /// Whether the field is present (even as `null`).
    pub(crate) fn has(&self, key: &str) -> bool {
        self.fields.contains_key(key)
    }

    /// The field's raw value; `null` counts as absent.
    pub(crate) fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.fields
            .get(key)
            .copied()
            .filter(|raw| kind(raw) != Kind::Null)
    }

    /// A string field; absent or `null` is `None`.
    pub(crate) fn string(&self, key: &str) -> Result<Option<String>, ParseError> {
        match self.get(key) {
            None => Ok(None),
            Some(raw) => as_string(raw)
                .map(Some)
                .map_err(|problem| self.error(key, &problem)),
        }
    }

    /// A string field that must be present.
    pub(crate) fn req_string(&self, key: &str) -> Result<String, ParseError> {
        match self.fields.get(key) {
            None => Err(self.error(key, "is missing")),
            Some(raw) => as_string(raw).map_err(|problem| self.error(key, &problem)),
        }
    }

    /// A boolean field; absent or `null` is `None`.
    pub(crate) fn bool(&self, key: &str) -> Result<Option<bool>, ParseError> {
        match self.get(key) {
            None => Ok(None),
            Some(raw) => match raw.get() {
                "true" => Ok(Some(true)),
                "false" => Ok(Some(false)),
                _ => Err(self.error(
                    key,
                    &format!("must be a boolean, found {}", kind(raw).described()),
                )),
            },
        }
    }

    /// An array field; absent or `null` is `None`.
    pub(crate) fn array(&self, key: &str) -> Result<Option<Vec<&'a RawValue>>, ParseError> {
        match self.get(key) {
            None => Ok(None),
            Some(raw) => as_array(raw).map(Some).ok_or_else(|| {
                self.error(
                    key,
                    &format!("must be an array, found {}", kind(raw).described()),
                )
            }),
        }
    }

    /// An object field; absent or `null` is `None`.
    pub(crate) fn object(&self, key: &str) -> Result<Option<Obj<'a>>, ParseError> {
        match self.get(key) {
            None => Ok(None),
            Some(raw) => {
                let path = self.path_of(key);
                let what = format!("`{path}`");
                Obj::parse(raw, path, self.line, &what).map(Some)
            }
        }
    }

    /// An object field that must be present.
    pub(crate) fn req_object(&self, key: &str) -> Result<Obj<'a>, ParseError> {
        let Some(raw) = self.fields.get(key) else {
            return Err(self.error(key, "is missing"));
        };
        let path = self.path_of(key);
        let what = format!("`{path}`");
        Obj::parse(raw, path, self.line, &what)
    }
}

/// Splits a `data:` URL into its media type and payload size: the decoded size for `;base64`
/// URLs, else the length of the (percent-encoded) data. `None` if `url` is not a data URL.
pub(crate) fn data_url(url: &str) -> Option<(String, u64)> {
    let rest = url.strip_prefix("data:")?;
    let (header, data) = rest.split_once(',')?;
    let media_type = header.split(';').next().unwrap_or_default();
    let media_type = if media_type.is_empty() {
        "text/plain".to_owned()
    } else {
        media_type.to_owned()
    };
    let len = if header.split(';').any(|p| p.eq_ignore_ascii_case("base64")) {
        base64_decoded_len(data)
    } else {
        data.len() as u64
    };
    Some((media_type, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(text: &str) -> &RawValue {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn compact_strips_only_insignificant_whitespace() {
        let text = "{ \"b\" : [1, 2.50 ,\n 3e2],\t\"a\": \"x y\\\" z\\\\\", \"c\": \"\\u001b \" }";
        assert_eq!(
            compact(raw(text)),
            r#"{"b":[1,2.50,3e2],"a":"x y\" z\\","c":"\u001b "}"#
        );
    }

    #[test]
    fn kinds_and_accessors_report_paths() {
        let obj = Obj::parse(
            raw(r#"{"s":"hi","n":5,"z":null,"o":{"k":true}}"#),
            "message".into(),
            7,
            "x",
        )
        .unwrap();
        assert_eq!(obj.string("s").unwrap().as_deref(), Some("hi"));
        assert_eq!(obj.string("z").unwrap(), None);
        assert_eq!(obj.string("absent").unwrap(), None);
        let err = obj.string("n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "line 7: `message.n` must be a string, found a number"
        );
        let err = obj.req_string("absent").unwrap_err();
        assert_eq!(err.to_string(), "line 7: `message.absent` is missing");
        let inner = obj.req_object("o").unwrap();
        assert_eq!(inner.bool("k").unwrap(), Some(true));
        let err = obj.req_object("s").unwrap_err();
        assert!(
            err.to_string()
                .contains("`message.s` must be a JSON object, found a string")
        );
    }

    #[test]
    fn base64_and_data_urls() {
        assert_eq!(base64_decoded_len("aGVsbG8="), 5);
        assert_eq!(base64_decoded_len("aGVsbG8"), 5);
        assert_eq!(base64_decoded_len("aGk="), 2);
        assert_eq!(base64_decoded_len(""), 0);
        assert_eq!(
            data_url("data:image/png;base64,aGVsbG8="),
            Some(("image/png".to_owned(), 5))
        );
        assert_eq!(data_url("data:,abc"), Some(("text/plain".to_owned(), 3)));
        assert_eq!(data_url("https://x/y.png"), None);
    }

    #[test]
    fn line_of_counts_newlines_before_a_sub_slice() {
        let text = "[\n  {\"a\": 1},\n  {\"b\": 2}\n]";
        let root = raw(text);
        let elements = as_array(root).unwrap();
        assert_eq!(elements.len(), 2);
        assert_eq!(line_of(root.get(), elements[0].get()), 2);
        assert_eq!(line_of(root.get(), elements[1].get()), 3);
        assert_eq!(line_of("abc", "other"), 1);
    }
}
