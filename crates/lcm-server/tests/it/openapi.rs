//! The OpenAPI document (docs/openapi.json, served at /openapi.json) and the router agree:
//! every route of the route table is documented with its method, and every documented
//! operation is one the router serves (checked over HTTP: no `no_route`, no 405).

use std::collections::BTreeSet;

use crate::common::start_default;
use lcm_server::{Access, ROUTES};
use reqwest::{Method, StatusCode};
use serde_json::Value;

fn document() -> Value {
    serde_json::from_str(lcm_server::OPENAPI).expect("docs/openapi.json is JSON")
}

/// (METHOD, path) of every documented operation.
fn documented() -> BTreeSet<(String, String)> {
    let doc = document();
    let mut out = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("path item").keys() {
            if ["get", "post", "put", "patch", "delete", "head", "options"]
                .contains(&method.as_str())
            {
                out.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    out
}

#[test]
fn the_document_lists_exactly_the_routes() {
    let routes: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|r| (r.method.to_owned(), r.path.to_owned()))
        .collect();
    assert_eq!(routes.len(), ROUTES.len(), "a route is listed twice");
    let documented = documented();
    let missing: Vec<_> = routes.difference(&documented).collect();
    let extra: Vec<_> = documented.difference(&routes).collect();
    assert!(
        missing.is_empty(),
        "routes missing from docs/openapi.json: {missing:?}"
    );
    assert!(extra.is_empty(), "documented but not served: {extra:?}");

    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    for route in ROUTES {
        let op = &doc["paths"][route.path][route.method.to_lowercase()];
        // Public routes say so (an empty security list); the others inherit the bearer scheme.
        let public = op["security"].as_array().is_some_and(Vec::is_empty);
        assert_eq!(
            public,
            route.access == Access::Public,
            "{} {}",
            route.method,
            route.path
        );
        // Every path parameter is declared.
        for name in route
            .path
            .split('{')
            .skip(1)
            .filter_map(|s| s.split('}').next())
        {
            let declared = op["parameters"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["name"] == name && p["in"] == "path"));
            assert!(
                declared,
                "{} {}: parameter {name} undeclared",
                route.method, route.path
            );
        }
        assert!(
            op["responses"].is_object(),
            "{} {}",
            route.method,
            route.path
        );
    }
    // Every reference resolves.
    let text = lcm_server::OPENAPI;
    for reference in text.split("\"$ref\": \"#/").skip(1) {
        let pointer = reference.split('"').next().unwrap();
        assert!(
            doc.pointer(&format!("/{pointer}")).is_some(),
            "unresolved $ref #/{pointer}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_operation_is_served() {
    let server = start_default().await;
    let served = server.get("/openapi.json").await;
    assert_eq!(served.status, StatusCode::OK);
    assert_eq!(served.body, document());
    for (method, path) in documented() {
        // Placeholder arguments: the handler may refuse them, but the router must route.
        let concrete = path
            .replace("{id}", "ses_999")
            .replace("{job}", "job_999")
            .replace("{name}", "lcm_grep");
        let method = Method::from_bytes(method.as_bytes()).unwrap();
        let body = (method == Method::POST).then(|| b"{}".to_vec());
        let answer = server.send(method.clone(), &concrete, body, None).await;
        assert_ne!(answer.kind(), "no_route", "{method} {path}: {answer:?}");
        assert_ne!(
            answer.status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_ne!(
            answer.status,
            StatusCode::INTERNAL_SERVER_ERROR,
            "{method} {path}: {answer:?}"
        );
    }
    // And what is not documented is not served.
    let answer = server.send(Method::GET, "/v1/secret", None, None).await;
    assert_eq!(answer.kind(), "no_route");
}
