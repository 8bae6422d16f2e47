//! A typed table read as a feed on PostgreSQL (see `crate::feed`): the same rows, order and
//! positions as an envelope table's, through a relation that gives sluice's own columns their
//! envelope names and the declared columns as one JSON object in `data` (what a reading flow
//! decodes its fields from): times in ISO 8601 (sessions run in UTC), numerics with their
//! digits, `bytes` in base64, `json` nested; attributes `{}` (a typed row has none).

use crate::StoreError;
use crate::typed::RESERVED;
use deadpool_postgres::GenericClient;

/// `jsonb_build_object` takes at most 100 arguments: 50 columns per call.
const COLUMNS_PER_OBJECT: usize = 50;

/// What the feed's statements read `table` through (spliced after `FROM`); `None` when the
/// table does not exist (yet).
pub(crate) async fn relation(
    client: &impl GenericClient,
    table: &str,
) -> Result<Option<String>, StoreError> {
    let rows = client
        .query(
            "SELECT column_name::text, data_type::text FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1
             ORDER BY ordinal_position",
            &[&table],
        )
        .await?;
    let mut typed = false;
    let mut pairs = Vec::new();
    for row in &rows {
        let name: String = row.try_get(0)?;
        let data_type: String = row.try_get(1)?;
        if name == crate::typed::TYPED_MARK {
            typed = true;
        }
        if name == "_sluice_deleted_at" {
            return Err(crate::typed::refuse_feed_of_keyed(table));
        }
        if name.starts_with(RESERVED) {
            continue;
        }
        let column = format!("\"{}\"", name.replace('"', "\"\""));
        let value = if data_type == "bytea" {
            // Base64 as the JSON decoder reads it (PostgreSQL breaks lines every 76 chars).
            format!("translate(encode({column}, 'base64'), E'\\n', '')")
        } else {
            column
        };
        pairs.push(format!("'{}', {value}", name.replace('\'', "''")));
    }
    if rows.is_empty() {
        return Ok(None);
    }
    if !typed {
        return Ok(Some(format!("\"{table}\"")));
    }
    let object = if pairs.is_empty() {
        "'{}'::jsonb".to_owned()
    } else {
        pairs
            .chunks(COLUMNS_PER_OBJECT)
            .map(|chunk| format!("jsonb_build_object({})", chunk.join(", ")))
            .collect::<Vec<_>>()
            .join(" || ")
    };
    Ok(Some(format!(
        "(SELECT _sluice_writer_xid AS writer_xid, _sluice_seq AS seq, _sluice_flow AS flow,
                 _sluice_dedup_key AS dedup_key, _sluice_message_id AS message_id,
                 _sluice_publish_time AS publish_time, _sluice_event_time AS event_time,
                 '{{}}'::jsonb AS attributes, convert_to(({object})::text, 'UTF8') AS data,
                 _sluice_committed_at AS committed_at
          FROM \"{table}\") AS feed"
    )))
}
