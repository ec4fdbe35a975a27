{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "djH5H2TmflBA9uklH3nNaJn1a/dKnb7j1Z2hpORgd0utt8hxvOpzcoQpZDfqPlVn0yCxhWganWPpFeRbd+u5Aw==",
  "signed_at": "2026-12-04T17:55:27Z",
  "manifest_sha256": "592c893a96cabdd19840e0b14770dd19fa85edaf25826341fd66bc68c84f77e0"
}
