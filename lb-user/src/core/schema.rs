//! The desired state's JSON Schema (`lb schema`, docs/schema.md), derived from the model's serde
//! types so that it cannot drift from them: every field, default, `deny_unknown_fields` and
//! keyword comes from the types `DesiredState::from_json` reads.
//!
//! What serde alone does not say is spelled out here, once, for the fields whose strings and
//! numbers the parser and validation check: addresses, port numbers, names, interface and
//! namespace names, timeouts, and the rules within one object that a schema can state (`vip` or
//! `vips`, a service serving something, `dsr` timeouts on `dsr` networks). The contract,
//! held by tests/schema.rs: a document the parser accepts, the schema accepts; what the parser
//! refuses for a value's spelling or range, the schema refuses too. Rules across objects
//! (uniqueness of names, VIPs and ports, address families) and on an address's class (unicast)
//! are the parser's alone: the descriptions and docs/schema.md state them.
use std::borrow::Cow;

use schemars::transform::RecursiveTransform;
use schemars::{JsonSchema, Schema, SchemaGenerator, generate::SchemaSettings, json_schema};
use serde_json::{Value, json};

use super::model::{DesiredState, IFNAMSIZ, MAX_NETWORK_NAME, MAX_SERVICE_NAME, MAX_TIMEOUT_SECS};

/// The schema of a desired-state document (JSON Schema draft 2020-12), as `lb schema` prints it.
pub fn desired_state() -> Schema {
    let mut schema = SchemaSettings::draft2020_12()
        .for_deserialize()
        .with_transform(RecursiveTransform(unwrap_description))
        .into_generator()
        .into_root_schema_for::<DesiredState>();
    schema.insert("title".into(), "lb desired state".into());
    schema
}

/// A doc comment's lines joined into one paragraph each, as an editor shows a description.
fn unwrap_description(schema: &mut Schema) {
    if let Some(Value::String(text)) = schema.get_mut("description") {
        *text = (text.split("\n\n"))
            .map(|paragraph| paragraph.replace('\n', " "))
            .collect::<Vec<_>>()
            .join("\n\n");
    }
}

/// A decimal IPv4 octet as Rust's parser reads it: no leading zero (which some C parsers would
/// read as octal), at most 255.
const OCTET: &str = "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
/// One group of an IPv6 address: one to four hex digits, either case.
const GROUP: &str = "[0-9A-Fa-f]{1,4}";

fn ipv4_pattern() -> String {
    format!(r"{OCTET}(\.{OCTET}){{3}}")
}

/// `part` repeated 0 to `n` times.
fn up_to(part: &str, n: usize) -> String {
    match n {
        0 => String::new(),
        n => format!("({part}){{0,{n}}}"),
    }
}

/// Every spelling Rust's `Ipv6Addr` parser takes: eight groups, or fewer around one `::` that
/// stands for at least one zero group, the last 32 bits optionally written as an IPv4 address.
fn ipv6_pattern() -> String {
    let v4 = ipv4_pattern();
    let groups = |n: usize| match n {
        0 => String::new(),
        1 => GROUP.to_owned(),
        n => format!("{GROUP}(:{GROUP}){{{}}}", n - 1),
    };
    let mut forms = vec![groups(8), format!("({GROUP}:){{6}}{v4}")];
    for head in 0..=7 {
        // `::` is at least one group, so head and tail have at most 7 between them; an
        // embedded IPv4 address counts as two.
        let room = 7 - head;
        let mut tails = Vec::new();
        if room >= 1 {
            tails.push(format!("{GROUP}{}", up_to(&format!(":{GROUP}"), room - 1)));
        }
        if room >= 2 {
            tails.push(format!("{}{v4}", up_to(&format!("{GROUP}:"), room - 2)));
        }
        let tail = if tails.is_empty() {
            String::new()
        } else {
            format!("({})?", tails.join("|"))
        };
        forms.push(format!("{}::{tail}", groups(head)));
    }
    format!("({})", forms.join("|"))
}

/// A control character, a slash, a colon or white space (Unicode's `White_Space`, as Rust's
/// `char::is_whitespace`), spelled out because regex dialects disagree on `\s`.
const NOT_IN_INTERFACE: &str =
    r"/:\u0000-\u0020\u007f-\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000";

/// Implements `JsonSchema` for a type that stands for a field's wire form in the schema (the
/// model's field keeps its real type, with `#[schemars(with = ...)]`).
macro_rules! wire_form {
    ($(#[$m:meta])* $name:ident, inline: $inline:literal, $schema:expr) => {
        $(#[$m])*
        pub(super) struct $name;

        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }

            fn inline_schema() -> bool {
                $inline
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                $schema
            }
        }
    };
}

wire_form!(
    /// `parse_ip`'s spellings.
    IpAddress, inline: false, {
    let v6 = ipv6_pattern();
    json_schema!({
        "type": "string",
        "description": "An IPv4 address in dotted-quad form (no leading zeros) or an IPv6 address, \
            bare or in brackets (`[fd00::1]`). Zone indices (`fe80::1%eth0`) are refused.",
        "pattern": format!(r"^({}|{v6}|\[{v6}\])$", ipv4_pattern()),
        "examples": ["10.0.0.5", "fd00::5"],
    })
});

wire_form!(
    /// `port_number`'s range.
    Port, inline: true, json_schema!({
    "type": "integer",
    "minimum": 1,
    "maximum": u16::MAX,
}));

wire_form!(
    /// `FlowTimeouts::validate`'s range.
    TimeoutSecs, inline: true, json_schema!({
    "type": "integer",
    "minimum": 1,
    "maximum": MAX_TIMEOUT_SECS,
}));

/// `check_name`'s rule: a conservative character set, never `.` or `..`.
fn name(max: usize) -> Schema {
    json_schema!({
        "type": "string",
        "pattern": "^[A-Za-z0-9_.-]+$",
        "maxLength": max,
        "not": {"enum": [".", ".."]},
    })
}

wire_form!(NetworkName, inline: true, name(MAX_NETWORK_NAME));
wire_form!(ServiceName, inline: true, name(MAX_SERVICE_NAME));

wire_form!(
    /// `check_interface`'s rule, the kernel's `dev_valid_name`; the schema counts characters
    /// where the kernel counts bytes, so a non-ASCII name can pass it and still be too long.
    Interfaces, inline: true, json_schema!({
    "type": "array",
    "minItems": 1,
    "uniqueItems": true,
    "items": {
        "type": "string",
        "pattern": format!("^[^{NOT_IN_INTERFACE}]+$"),
        "maxLength": IFNAMSIZ - 1,
        "not": {"enum": [".", ".."]},
    },
}));

wire_form!(
    /// `check_netns`'s rule.
    Netns, inline: true, json_schema!({
    "type": ["string", "null"],
    "pattern": r"^(/[^\u0000]*|[^/\u0000]+)$",
    "not": {"enum": [".", ".."]},
}));

/// `vips`: at most one per family (which one is the parser's to check).
pub(super) fn vips(generator: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": ["array", "null"],
        "items": generator.subschema_for::<IpAddress>(),
        "maxItems": 2,
        "uniqueItems": true,
    })
}

/// A service's rules within itself: `vip` or `vips`, not both; and at least a VIP or a port.
pub(super) fn service(schema: &mut Schema) {
    let present = |field: &str, is: Value| json!({"required": [field], "properties": {field: is}});
    let vip = present("vip", json!({"type": "string"}));
    let vips = present("vips", json!({"type": "array", "minItems": 1}));
    let ports = present("ports", json!({"minItems": 1}));
    let mut both = vip.clone();
    both["required"] = json!(["vip", "vips"]);
    both["properties"]["vips"] = json!({"type": "array"});
    schema.insert("not".into(), both);
    schema.insert("anyOf".into(), json!([vip, vips, ports]));
}

/// A network's rule within itself: a `dsr` timeout only on a `dsr` network.
pub(super) fn network(schema: &mut Schema) {
    schema.insert(
        "if".into(),
        json!({"not": {"required": ["mode"], "properties": {"mode": {"const": "dsr"}}}}),
    );
    schema.insert(
        "then".into(),
        json!({"properties": {"timeouts": {"properties": {"dsr": {"type": "null"}}}}}),
    );
}
