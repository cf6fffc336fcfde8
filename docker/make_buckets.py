"""The Docker demo's buckets, made on its S3 service (MinIO, or moto's server in
docker-compose.local-s3.yml) with the credentials in the environment (AWS_ACCESS_KEY_ID...).

    python docker/make_buckets.py --endpoint-url http://s3:9000 replog-metadata replog-broker-0

A bucket that exists already is kept, so a restarted run changes nothing.
"""

from __future__ import annotations

import argparse

import s3fs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--endpoint-url", required=True, help="the S3 service, http://HOST:PORT")
    parser.add_argument("buckets", nargs="+")
    args = parser.parse_args()
    fs = s3fs.S3FileSystem(endpoint_url=args.endpoint_url, use_listings_cache=False)
    for bucket in args.buckets:
        if fs.exists(bucket):
            print(f"bucket {bucket}: there", flush=True)
        else:
            fs.mkdir(bucket)
            print(f"bucket {bucket}: made", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
