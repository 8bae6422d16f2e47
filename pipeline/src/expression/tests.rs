//! The checker and the writers, on expressions over a few typed fields.

use super::*;
use ColumnType as C;

fn fields() -> Vec<(String, ColumnType)> {
    [
        ("order_id", C::Text),
        ("amount", C::Numeric),
        ("qty", C::Integer),
        ("ts", C::Timestamp),
        ("vip", C::Boolean),
        ("_sluice_attributes", C::Json),
    ]
    .map(|(n, t)| (n.to_owned(), t))
    .to_vec()
}

fn ok(text: &str) -> Expression {
    compile(text, &fields()).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn err(text: &str) -> String {
    compile(text, &fields()).expect_err(text)
}

#[test]
fn typed_expressions_render_for_both_stores() {
    let e = ok("CAST(amount AS numeric) * 100");
    assert_eq!(e.postgres, "(CAST(\"amount\" AS NUMERIC) * 100)");
    assert_eq!(e.sqlite, "(sluice_cast_numeric(\"amount\") * 100)");
    assert_eq!(e.ty, Some(C::Numeric));
    let e = ok("amount::integer");
    assert_eq!(e.sqlite, "sluice_cast_integer(\"amount\")");
    assert_eq!(ok("amount > 0 AND NOT vip").ty, Some(C::Boolean));
    assert_eq!(ok("_sluice_attributes ->> 'region'").ty, Some(C::Text));
    assert_eq!(ok("ts >= '2026-01-01'").ty, Some(C::Boolean));
    assert_eq!(
        ok("CASE WHEN qty > 10 THEN 'bulk' ELSE 'single' END").ty,
        Some(C::Text)
    );
    assert_eq!(ok("coalesce(upper(order_id), 'none')").ty, Some(C::Text));
    assert_eq!(ok("qty IN (1, 2, 3)").ty, Some(C::Boolean));
    assert_eq!(ok("'it''s'").sqlite, "'it''s'");
}

#[test]
fn what_would_differ_between_stores_is_refused() {
    assert!(err("amountt + 1").contains("unknown column `amountt`"));
    assert!(err("order_id > 3").contains("do not mix"));
    assert!(err("amount > '3'").contains("string literal next to numeric"));
    assert!(err("qty AND vip").contains("needs a boolean"));
    assert!(err("now()").contains("function `now`"));
    assert!(err("(SELECT 1)").contains("not supported"));
    assert!(err("qty + 1 qty").contains("follows it"));
    assert!(err("CAST(qty AS money)").contains("types are"));
    assert!(err("round(CAST(qty AS double), 2)").contains("numeric"));
    assert!(err("t.qty").contains("by itself"));
    assert!(err("").contains("not an SQL expression"));
}

#[test]
fn both_stores_compute_alike() {
    let e = ok("ts >= '2026-01-01'");
    assert_eq!(
        e.postgres,
        "(\"ts\" >= CAST('2026-01-01T00:00:00.000Z' AS TIMESTAMPTZ))"
    );
    assert_eq!(e.sqlite, "(\"ts\" >= '2026-01-01T00:00:00.000Z')");
    assert!(
        ok("ts IN ('2026-01-01T10:00:00+01:00')")
            .sqlite
            .contains("'2026-01-01T09:00:00.000Z'")
    );
    assert!(err("ts > 'yesterday'").contains("not a timestamp"));
    assert!(err("coalesce(ts, '1970-01-01')").contains("CAST it"));
    let e = ok("amount / 2");
    assert_eq!(e.sqlite, "(CAST(\"amount\" AS REAL) / sluice_nonzero(2))");
    assert_eq!(e.postgres, "(\"amount\" / 2)");
    assert_eq!(ok("qty / 2").sqlite, "(\"qty\" / sluice_nonzero(2))");
    assert!(ok("qty % 2").sqlite.contains("sluice_nonzero"));
    assert!(err("amount % 2").contains("integers"));
    assert!(err("coalesce(qty)").contains("2 to 64"));
    assert!(err("1_000 + qty").contains("decimal"));
    assert!(err("0x1F + qty").contains("decimal"));
    assert!(err("CAST(vip AS text)").contains("CAST from boolean"));
    assert_eq!(ok("CAST(ts AS date)").ty, Some(C::Date));
    assert_eq!(
        ok("substr(order_id, qty)").postgres,
        "substr(\"order_id\", CAST(\"qty\" AS INTEGER))"
    );
    assert!(err("_sluice_attributes ->> order_id").contains("literal"));
    assert_eq!(
        ok("_sluice_attributes ->> 'region'").sqlite,
        "CAST((\"_sluice_attributes\" ->> 'region') AS TEXT)"
    );
    assert!(ok("order_id LIKE 'o%'").sqlite.ends_with("ESCAPE '\\')"));
}

#[test]
fn values_fit_columns_of_their_kind() {
    assert!(fits(&ok("qty"), C::Numeric));
    assert!(fits(&ok("amount"), C::Double));
    assert!(!fits(&ok("amount"), C::Integer));
    assert!(!fits(&ok("order_id"), C::Integer));
    assert!(fits(&ok("NULL"), C::Integer));
}
