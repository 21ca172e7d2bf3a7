import setuptools

setuptools.setup(name="tinydofns", version="0.1", packages=["tinydofns"])
