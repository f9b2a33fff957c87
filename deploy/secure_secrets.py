"""Make the secrets of the TLS + SASL/SCRAM variant of docker-compose (``docker-compose.secure.yml``).

Run once from the repository root, before the first ``docker compose -f docker-compose.yml
-f docker-compose.secure.yml up``::

    python deploy/secure_secrets.py            # writes ./secrets/ (never overwrites a file)

It writes, into ``secrets/`` (``--out``):

* ``kafka/``, mounted into the Kafka container at ``/etc/kafka/secrets`` (where the
  apache/kafka image looks): ``kafka.p12`` (the broker's key and certificate, PKCS#12,
  for the hosts ``kafka``, ``kafka-2``, ``kafka-3`` and ``localhost``), ``kafka_keystore_creds`` (its password, also
  the key's), ``kafka_jaas.conf`` (the broker accepts SCRAM; ``KAFKA_OPTS`` names it);
* ``kafka_ca.pem``: the CA that signed it, which clients trust (``ssl.ca.location``);
* ``jobreg_kafka_password``: the SCRAM password of the Kafka user ``jobreg``
  (``kafka-init`` creates the user with it);
* ``client.properties``: what every jobreg service reads (``JOBREG_KAFKA_CONFIG``): SASL_SSL,
  SCRAM-SHA-512, the user, its password by ``${file:...}`` (never in the file itself) and
  the CA. From the host, copy it and point the two paths at ``secrets/``.

The files are readable by all (umask permitting): the containers' users (the Kafka image's
``appuser``, jobreg's ``jobreg``) are not the host user who made them, and compose mounts
files as they are. Keep ``secrets/`` itself private to the host's operators (``chmod 700``
on a multi-user host breaks nothing: Docker's daemon reads it as root).

The CA is this deployment's own, valid for ``--days`` (825): a production cluster has its
certificates from its own CA instead, and only ``client.properties`` matters to jobreg.
Needs the ``cryptography`` package (a jobreg dependency).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import secrets
import sys
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

HOSTS = ("kafka", "kafka-2", "kafka-3", "localhost")  # the three brokers of docker-compose.yml
CLIENT_PROPERTIES = """\
# jobreg's Kafka client properties for docker-compose.secure.yml (JOBREG_KAFKA_CONFIG)
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.username=jobreg
sasl.password=${file:/run/secrets/jobreg_kafka_password}
ssl.ca.location=/run/secrets/kafka_ca.pem
"""
JAAS = """\
KafkaServer {
    org.apache.kafka.common.security.scram.ScramLoginModule required;
};
"""


def make(out: Path, *, days: int = 825) -> dict[str, Path]:
    """Write the secrets into ``out``; refuse to overwrite any. Returns what it wrote."""
    paths = {"keystore": out / "kafka" / "kafka.p12",
             "keystore_creds": out / "kafka" / "kafka_keystore_creds",
             "jaas": out / "kafka" / "kafka_jaas.conf",
             "ca": out / "kafka_ca.pem",
             "password": out / "jobreg_kafka_password",
             "client": out / "client.properties"}
    there = [str(p) for p in paths.values() if p.exists()]
    if there:
        raise FileExistsError(f"already there (delete them to make new ones): {', '.join(there)}")
    now = dt.datetime.now(dt.UTC)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), \
        ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jobreg compose CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    names: list[x509.GeneralName] = [x509.DNSName(h) for h in HOSTS]
    names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, HOSTS[0])]))
              .issuer_name(ca_name).public_key(server_key.public_key())
              .serial_number(x509.random_serial_number())
              .not_valid_before(now - dt.timedelta(minutes=5))
              .not_valid_after(now + dt.timedelta(days=days))
              .add_extension(x509.SubjectAlternativeName(names), critical=False)
              .sign(ca_key, hashes.SHA256()))
    store_password = secrets.token_urlsafe(24)
    paths["keystore"].parent.mkdir(parents=True, exist_ok=True)
    paths["keystore"].write_bytes(pkcs12.serialize_key_and_certificates(
        b"kafka", server_key, server, [ca],
        serialization.BestAvailableEncryption(store_password.encode())))
    paths["keystore_creds"].write_text(store_password)
    paths["jaas"].write_text(JAAS)
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["password"].write_text(secrets.token_urlsafe(24))
    paths["client"].write_text(CLIENT_PROPERTIES)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("secrets"),
                        help="where to write them (default: ./secrets)")
    parser.add_argument("--days", type=int, default=825, help="certificate validity in days")
    args = parser.parse_args(argv)
    try:
        wrote = make(args.out, days=args.days)
    except (OSError, ValueError) as e:
        print(f"secure_secrets: {e}", file=sys.stderr)
        return 1
    for path in wrote.values():
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
